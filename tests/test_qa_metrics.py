from tider.forest.prompts import parse_msg_id, parse_verdict
from tider.scoring import answer_f1, is_abstention, multi_answer_f1, token_f1


def test_token_f1():
    assert token_f1("The Sweden!", "sweden") == 1.0
    assert abs(token_f1("went to Paris in May", "Paris") - 2 * (1 / 5) / (1 + 1 / 5)) < 1e-9
    assert token_f1("", "x") == 0.0


def test_multi_hop_and_adversarial():
    assert multi_answer_f1("painting, hiking", "hiking, painting") == 1.0
    assert multi_answer_f1("painting", "hiking, painting") == 0.5
    assert answer_f1("painting", "hiking, painting", "1") == 0.5
    assert answer_f1("Not mentioned in the conversation.", None, "5") == 1.0
    assert answer_f1("Sweden", "x", "adversarial") == 0.0
    assert is_abstention("No information available")


def test_verdict_and_ids():
    assert parse_verdict("thinking... Final: Correct") is True
    assert parse_verdict("Final: Correct\nFinal: Incorrect") is False
    assert parse_verdict("garbage") is None
    assert parse_msg_id("Msg_12") == 12 and parse_msg_id(3) == 3 and parse_msg_id("12x") is None
    assert parse_msg_id(True) is None


def test_think_only_reply_is_empty():
    from tider.llm.jsonout import strip_think

    assert strip_think("<think>Alice moved in May.</think>\n\n").strip() == ""
    assert strip_think("<think>x</think> Sweden").strip() == "Sweden"
