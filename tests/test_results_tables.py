"""The README stays a user's guide: at most 400 lines, and every results table in it is what
scripts/results_tables.py makes from its results file (a hand-edited figure fails CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "results_tables.py"


def check(readme: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--readme", str(readme)], capture_output=True, text=True, check=False
    )


def test_the_readme_is_at_most_400_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400


def test_the_readme_tables_are_their_results_files():
    done = check(ROOT / "README.md")
    assert done.returncode == 0, done.stderr
    assert "<!-- table:real -->" in (ROOT / "README.md").read_text()


def test_a_hand_edited_figure_fails_the_check_and_a_rewrite_fixes_it(tmp_path):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- table:real -->")
    edited = text[:start] + text[start:].replace("| pooled, ", "| pooled (hand-edited), ", 1)
    readme.write_text(edited)
    done = check(readme)
    assert done.returncode == 1 and "hand-edited" in done.stderr
    subprocess.run([sys.executable, str(SCRIPT), "--readme", str(readme)], check=True)
    assert readme.read_text() == text and check(readme).returncode == 0


def test_an_unknown_or_unclosed_table_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- table:nosuch -->\n<!-- /table:nosuch -->\n")
    assert "knows" in check(readme).stderr
    readme.write_text("<!-- table:real -->\nno end\n")
    assert "no closing" in check(readme).stderr
