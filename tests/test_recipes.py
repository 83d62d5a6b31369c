"""Every shipped recipe runs for real: each file under configs/sft and configs/grpo goes
through `tider sft|grpo --config RECIPE` (a fresh process, as a user runs it) for 1-2
steps. What the tests override, and why:

- the model: the recipes' tiny Qwen3 (built by configs/sft/tiny-cpu.yaml), at test size
  (hidden 64, 2 layers): Qwen3-1.7B weights cannot be downloaded here;
- the data: a small embedded synthetic benchmark written to disk (LoCoMo is a download);
- the step count (1-2), `--use_cpu true` for the GPU recipes (no GPU here; bf16 stays on),
  `--report_to none`, and the reader URL/name of `answer_correct`: a real vLLM server
  serving the tiny Qwen3 (tests/conftest.py), which checks the wiring, not its answers.

Everything else is the recipe: vLLM colocated inside the trainer (`use_vllm: true`), DAR,
the reward list and weights, gradient checkpointing, LoRA through `use_peft`. The
production GRPO run also holds vLLM's sampling to the locator's JSON shape (see LOCATOR_JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Generous per-test bound: a fixture trains first, and CI machines may be shared.
pytestmark = [pytest.mark.recipe, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name in ("sft", "grpo")
)
TINY = ["--tiny_hidden_size", "64", "--tiny_num_layers", "2", "--tiny_num_heads", "2", "--tiny_vocab_size", "1024"]
COMMON = ["--report_to", "none", "--logging_steps", "1"]


def tider(stage: str, recipe: str, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "tider.cli", stage, "--config", str(ROOT / recipe), *overrides],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"{stage} {recipe} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return run


def history(output_dir: Path) -> list[dict]:
    return json.loads((output_dir / "trainer_state.json").read_text())["log_history"]


def steps(output_dir: Path) -> list[int]:
    return [h["step"] for h in history(output_dir) if "loss" in h]


def test_every_recipe_has_a_test():
    tested = {
        "configs/sft/tiny-cpu.yaml",
        "configs/sft/tiny-pretrain.yaml",
        "configs/sft/tiny-pretrain-answer.yaml",
        "configs/grpo/tiny-cpu.yaml",
        "configs/sft/tiny-real.yaml",
        "configs/grpo/tiny-real.yaml",
        "configs/sft/qwen3-1.7b.yaml",
        "configs/grpo/qwen3-1.7b.yaml",
        "configs/grpo/qwen3-1.7b-multinode.yaml",
    }
    assert set(RECIPES) == tested, "a new recipe needs a test in this file"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from tider.data.synth import generate, write

    out = tmp_path_factory.mktemp("recipe-data") / "synthetic"
    write(generate(600, seed=0, n_conversations=3), str(out))
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("recipes")


def data_args(data_dir: Path) -> list[str]:
    """The test-size synthetic data instead of the recipe's; a recipe's fixed split names real
    conversations and personas, which synthetic data has not, so it is cleared."""
    return [
        "--dataset_name",
        "synthetic",
        "--dataset_path",
        str(data_dir),
        "--validation_memories",
        "",
        "--test_memories",
        "",
    ]


@pytest.fixture(scope="module")
def real_like(tmp_path_factory):
    """LoCoMo- and RealMem-format files with the names the fixed split of the real-data
    recipes lists (the real dev copies are not in the repository)."""
    from conftest import write_real_like

    return write_real_like(tmp_path_factory.mktemp("real-like"))


@pytest.fixture(scope="module")
def tiny_pretrain(work, real_like):
    """configs/sft/tiny-pretrain.yaml as written (its own training-only seeds, generated data)
    but at test size: fewer messages and train-only conversations, 2 steps. It builds the
    tiny Qwen3 the other recipes start from (as models/tiny-locator-v3 was built)."""
    out = work / "tiny-pretrain"
    tider(
        "sft",
        "configs/sft/tiny-pretrain.yaml",
        "--model_name_or_path",
        str(work / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        "--synthetic_messages",
        "600",
        "--synthetic_conversations",
        "3",
        "--synthetic_train_conversations",
        "1",
        "--dataset_path",
        f",{real_like[1]}",  # the synthetic part is generated; RealMem's path is the recipe's data/realmem
        *TINY,
        *COMMON,
    )
    return out


def test_sft_tiny_pretrain(tiny_pretrain, work):
    from tider.locator.contract import LocatorMetadata

    assert (work / "base" / "config.json").exists() and steps(tiny_pretrain) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-pretrain.yaml").read_text())
    assert recipe["dataset_seed"] >= 1000 and recipe["synthetic_train_seed"] >= 1000  # disjoint from evaluations
    meta = LocatorMetadata.read(tiny_pretrain)
    assert meta.prompt_settings["lines"]["max_lines"] == recipe["prompt_lines"]
    assert meta.dataset_name == "synthetic+realmem" and meta.test_memories == recipe["test_memories"]


@pytest.fixture(scope="module")
def tiny_pretrain_answer(tiny_pretrain, work, real_like):
    """configs/sft/tiny-pretrain-answer.yaml (the start's answer-only phase) from the above,
    with the same test-size data, 2 steps."""
    out = work / "tiny-pretrain-answer"
    tider(
        "sft",
        "configs/sft/tiny-pretrain-answer.yaml",
        "--model_name_or_path",
        str(tiny_pretrain),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--synthetic_messages",
        "600",
        "--synthetic_conversations",
        "3",
        "--synthetic_train_conversations",
        "1",
        "--dataset_path",
        f",{real_like[1]}",
        *COMMON,
    )
    return out


def test_sft_tiny_pretrain_answer(tiny_pretrain_answer, tiny_pretrain):
    from tider.locator.contract import LocatorMetadata

    assert steps(tiny_pretrain_answer) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-pretrain-answer.yaml").read_text())
    assert recipe["completion_only_loss"] is True and recipe["model_name_or_path"] == "runs/tiny-pretrain/sft"
    first, second = LocatorMetadata.read(tiny_pretrain), LocatorMetadata.read(tiny_pretrain_answer)
    # the same data and prompt as the first phase: one start, two phases
    assert second.training_data_hash == first.training_data_hash and second.prompt_settings == first.prompt_settings


@pytest.fixture(scope="module")
def tiny_sft(tiny_pretrain_answer, work, data_dir):
    """configs/sft/tiny-cpu.yaml, 2 steps, fine-tuning the pretrained start (the recipe names
    the shipped models/tiny-locator-v3; here the test-size one above)."""
    out = work / "tiny-sft"
    tider(
        "sft",
        "configs/sft/tiny-cpu.yaml",
        "--model_name_or_path",
        str(tiny_pretrain_answer),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        *data_args(data_dir),
        *COMMON,
    )
    return out


def test_sft_tiny_cpu(tiny_sft):
    assert steps(tiny_sft) == [1, 2] and (tiny_sft / "tider_locator.json").exists()
    assert json.loads((tiny_sft / "config.json").read_text())["dtype"] in ("float32", "bfloat16")  # dtype: auto
    assert len((tiny_sft / "metrics.jsonl").read_text().splitlines()) >= 2  # per-step metrics go to the file
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-cpu.yaml").read_text())
    assert (ROOT / recipe["model_name_or_path"] / "config.json").exists()  # the shipped starting point


def test_grpo_tiny_cpu(tiny_sft, work, data_dir):
    out = work / "tiny-grpo"
    run = tider(
        "grpo",
        "configs/grpo/tiny-cpu.yaml",
        "--model_name_or_path",
        str(tiny_sft),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        *data_args(data_dir),
        *COMMON,
    )
    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-cpu.yaml").read_text())
    logged = history(out)
    for name in recipe["reward_funcs"]:
        assert any(f"rewards/{name}/mean" in h for h in logged), name
    assert any("frac_reward_zero_std" in h for h in logged)
    assert json.loads((out / "dar.json").read_text())["effective_probabilities"]
    assert "zero_std=" in run.stderr + run.stdout  # the progress line shows it
    assert "'loss'" not in run.stdout  # no per-step metrics dicts on the terminal


@pytest.fixture(scope="module")
def tiny_real(tiny_pretrain_answer, work, real_like):
    """configs/sft/tiny-real.yaml, 2 steps from the test-size start, on LoCoMo- and
    RealMem-format files that carry the names of its fixed split."""
    out = work / "tiny-real"
    tider(
        "sft",
        "configs/sft/tiny-real.yaml",
        "--model_name_or_path",
        str(tiny_pretrain_answer),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--dataset_path",
        f"{real_like[0]},{real_like[1]}",
        *COMMON,
    )
    return out


def test_sft_tiny_real(tiny_real):
    from tider.locator.contract import LocatorMetadata

    assert steps(tiny_real) == [1, 2]
    recipe = yaml.safe_load((ROOT / "configs/sft/tiny-real.yaml").read_text())
    meta = LocatorMetadata.read(tiny_real)
    assert meta.dataset_name == "locomo+realmem"
    assert (meta.validation_memories, meta.test_memories) == (recipe["validation_memories"], recipe["test_memories"])
    # the shipped start is the one the pretrain recipes make, and it never trained on these memories
    start = LocatorMetadata.read(ROOT / recipe["model_name_or_path"])
    assert set(start.test_memories or ()) <= set(recipe["test_memories"])


def test_grpo_tiny_real(tiny_real, work, real_like):
    out = work / "tiny-real-grpo"
    tider(
        "grpo",
        "configs/grpo/tiny-real.yaml",
        "--model_name_or_path",
        str(tiny_real),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--dataset_path",
        f"{real_like[0]},{real_like[1]}",
        *COMMON,
    )
    recipe = yaml.safe_load((ROOT / "configs/grpo/tiny-real.yaml").read_text())
    for name in recipe["reward_funcs"]:
        assert any(f"rewards/{name}/mean" in h for h in history(out)), name
    assert recipe["test_memories"] == yaml.safe_load((ROOT / "configs/sft/tiny-real.yaml").read_text())["test_memories"]


def test_grpo_tiny_cpu_vllm_samples_from_the_trained_weights(work, data_dir):
    """The colocated engine must generate with the weights of the current step. Pushed hard
    (lr 3e-3 from the shipped start) the policy moves far from its start (KL > 0.5), while
    the log-probabilities vLLM sampled with stay those of the trainer's own weights (TRL
    logs their difference): a stale engine would sample from the start, off by about the
    KL. On AVX-512 CPUs this failed outright before (vLLM dropped the packed weights' loaders;
    tider.train.grpo.compute_cpu_linears_on_live_weights)."""
    out = work / "tiny-grpo-moving"
    tider(
        "grpo",
        "configs/grpo/tiny-cpu.yaml",
        "--model_name_or_path",
        str(ROOT / "models/tiny-locator-v3"),
        "--output_dir",
        str(out),
        "--max_steps",
        "3",
        "--save_strategy",
        "no",
        "--learning_rate",
        "3e-3",
        "--lr_scheduler_type",
        "constant",
        "--warmup_steps",
        "0",
        *data_args(data_dir),
        *COMMON,
    )
    last = [h for h in history(out) if "kl" in h][-1]
    assert last["kl"] > 0.5, last
    assert last["sampling/sampling_logp_difference/mean"] < 0.05, last


@pytest.fixture(scope="module")
def production_sft(tiny_sft, work, data_dir):
    out = work / "qwen3-sft"
    tider(
        "sft",
        "configs/sft/qwen3-1.7b.yaml",
        "--model_name_or_path",
        str(work / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--use_cpu",
        "true",
        *data_args(data_dir),
        *COMMON,
    )
    return out


def test_sft_qwen3_production(production_sft):
    args = json.loads((production_sft / "tider_locator.json").read_text())
    settings = args["prompt_settings"]  # the recipe's prompt settings
    assert settings["lines"]["max_lines"] == 30 and settings["max_prompt_tokens"] == 3584
    assert steps(production_sft) == [1]


def test_sft_qwen3_production_lora(tiny_sft, work, data_dir):
    """The recipe's documented LoRA switch (`use_peft: true`, its lora_r/alpha/targets)."""
    out = work / "qwen3-sft-lora"
    tider(
        "sft",
        "configs/sft/qwen3-1.7b.yaml",
        "--model_name_or_path",
        str(work / "base"),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--use_cpu",
        "true",
        "--use_peft",
        "true",
        *data_args(data_dir),
        *COMMON,
    )
    adapter = json.loads((out / "adapter_config.json").read_text())
    recipe = yaml.safe_load((ROOT / "configs/sft/qwen3-1.7b.yaml").read_text())
    assert adapter["r"] == recipe["lora_r"] and adapter["lora_alpha"] == recipe["lora_alpha"]
    assert set(adapter["target_modules"]) == set(recipe["lora_target_modules"])


# Completions the rewards can read from a model trained for one step: vLLM's structured
# output (TRL's `vllm_structured_outputs_regex`, not set by the recipe) holds generation to the
# locator's JSON with plausible dates, so the retrieval rewards and the reader really run
# (noise parses never, and every reward would score it 0 without reading it).
LOCATOR_JSON = (
    r'\{"temporal": (false, "windows": \[\]|true, "windows": \[\{"start": "2023-0[1-9]-(0[1-9]|1[0-9]|2[0-8])", '
    r'"end": "2023-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"\}\])\}'
)


@pytest.mark.vllm
def test_grpo_qwen3_production(production_sft, work, data_dir, vllm_server):
    """vLLM colocated in the trainer generates the completions; `answer_correct` asks the
    served reader; DAR resamples. One step of the recipe's 4 prompts x G=8."""
    out = work / "qwen3-grpo"
    server_log = Path(vllm_server.log_path)
    served_before = server_log.read_text(errors="replace").count("POST /v1/chat/completions")
    tider(
        "grpo",
        "configs/grpo/qwen3-1.7b.yaml",
        "--model_name_or_path",
        str(production_sft),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--use_cpu",
        "true",
        "--reader_base_url",
        vllm_server.base_url,
        "--reader_model",
        vllm_server.model_name,
        "--vllm_structured_outputs_regex",
        LOCATOR_JSON,
        *data_args(data_dir),
        *COMMON,
    )
    [logged] = [h for h in history(out) if "loss" in h]
    # generation went through vLLM inside the trainer: TRL logs its sampling-vs-training logprob gap
    assert "sampling/sampling_logp_difference/mean" in logged, sorted(logged)
    recipe = yaml.safe_load((ROOT / "configs/grpo/qwen3-1.7b.yaml").read_text())
    for name in recipe["reward_funcs"]:
        assert f"rewards/{name}/mean" in logged, name
    # answer_correct rewards came from the served reader (its access log grew), failures counted
    assert logged["reader/calls"] > 0, logged
    assert server_log.read_text(errors="replace").count("POST /v1/chat/completions") > served_before
    assert json.loads((out / "dar.json").read_text())["factors"]["0"] == 10.0  # the paper's DAR factors
    assert (out / "tider_locator.json").exists()


@pytest.mark.vllm
def test_grpo_qwen3_multinode_server_mode(tiny_sft, work, data_dir, tmp_path, vllm_server):
    """Server mode as scripts/slurm/train.slurm runs it, on one CPU box: the server gets
    `trl vllm-serve`'s flags (TRL's own command builder) and starts; its health check and
    generation answer TRL's client; the recipe's trainer connects to it. Weight sync stops
    there: TRL pushes weights through vLLM's NCCL weight-transfer engine, and every engine
    vLLM ships needs CUDA, so on CPU the trainer must fail with that reason, not hang."""
    from trl.generation.vllm_client import VLLMClient

    from tider.llm.vllm_server import VLLMServer, free_port, trl_server_flags

    port = free_port()
    server = VLLMServer(
        str(tiny_sft),
        port=port,
        extra_args=trl_server_flags(str(tiny_sft), port=port, cuda=False),
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        log_path=tmp_path / "trl-server.log",
        startup_timeout=300,
    )
    with server:
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=60)  # check_server: /health
        out = client.generate(["2023-05-07 Alice"], n=2, max_tokens=8, temperature=0.7)
        assert len(out["completion_ids"]) == 2 and all(len(ids) > 0 for ids in out["completion_ids"])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "tider.cli",
                "grpo",
                "--config",
                str(ROOT / "configs/grpo/qwen3-1.7b-multinode.yaml"),
                "--model_name_or_path",
                str(tiny_sft),
                "--output_dir",
                str(work / "multinode"),
                "--max_steps",
                "1",
                "--use_cpu",
                "true",
                "--vllm_server_host",
                "127.0.0.1",
                "--vllm_server_port",
                str(port),
                "--reader_base_url",
                vllm_server.base_url,
                "--reader_model",
                vllm_server.model_name,
                *data_args(data_dir),
                *COMMON,
            ],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert run.returncode != 0
    assert "weight sync" in run.stderr and "CUDA" in run.stderr, run.stderr[-4000:]
    assert "connected to the vLLM server" in run.stderr + run.stdout  # it got that far


REALMEM = ROOT.parent / "shared" / "data" / "realmem"


@pytest.mark.slow
@pytest.mark.skipif(not REALMEM.is_dir(), reason="needs the RealMem dev copy at ../shared/data/realmem")
def test_shipped_starting_point_is_what_the_pretrain_recipe_trains_on():
    """models/tiny-locator-v3 records the hash of its training queries; the recipes' data as
    written (training-only synthetic seeds, checked disjoint from evaluations above, and the
    RealMem train personas) gives the same hash in both phases (tiny-pretrain, then
    tiny-pretrain-answer), and the same prompt settings."""
    from tider.locator.contract import LocatorMetadata
    from tider.locator.prompt import PromptSettings
    from tider.train.config import parse_recipe
    from tider.train.data import fixed_split, load_training_dataset, training_data_hash
    from tider.train.examples import split_queries

    meta = LocatorMetadata.read(ROOT / "models/tiny-locator-v3")
    first, second = (
        parse_recipe("sft", ["--config", str(ROOT / f"configs/sft/{r}.yaml"), "--dataset_path", f",{REALMEM}"])[0]
        for r in ("tiny-pretrain", "tiny-pretrain-answer")
    )
    data_fields = (
        "dataset_name",
        "dataset_seed",
        "split_seed",
        "validation_memories",
        "test_memories",
        "synthetic_messages",
        "synthetic_conversations",
        "synthetic_train_conversations",
        "synthetic_train_seed",
    )
    assert [getattr(first, f) for f in data_fields] == [getattr(second, f) for f in data_fields]
    dataset = load_training_dataset(first)
    train = split_queries(dataset, first.split_seed, **fixed_split(first))["train"]
    assert meta.training_data_hash == training_data_hash(dataset, [q.key for q in train])
    for script_args in (first, second):
        assert PromptSettings.from_json(meta.prompt_settings) == script_args.prompt_settings()
