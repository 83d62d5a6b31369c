"""`tider export`: training checkpoint (LoRA, full or DeepSpeed ZeRO-3) -> servable locator folder."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="merge/copy a trained locator into a servable folder and verify it",
        description=(
            "Merge LoRA adapters (peft merge_and_unload) or copy full weights into safetensors + "
            "tokenizer + chat template + generation config + tider_locator.json, then reload the "
            "export and compare logits and greedy outputs with the source. DeepSpeed ZeRO-3 "
            "checkpoints are gathered with deepspeed's zero_to_fp32 (install tider[gpu]), or run "
            "`python CKPT/zero_to_fp32.py CKPT OUT --safe_serialization` first. The export is "
            "written and verified in a temporary folder next to --out and renamed into place only "
            "once verified: a failed export leaves --out (and, with --overwrite, the old export) as it was."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="trainer output or checkpoint-N folder")
    p.add_argument("--out", required=True, help="export folder to write")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype; float32 makes CPU vLLM match local greedy decoding exactly",
    )
    p.add_argument(
        "--base-model", default=None, help="base model for a LoRA adapter (default: from adapter_config.json)"
    )
    p.add_argument(
        "--granularity",
        default=None,
        choices=["day", "minute"],
        help="time granularity the locator speaks (default: from training's tider_locator.json)",
    )
    p.add_argument("--data-hash", default=None, help="training-data hash to record (default: from training)")
    p.add_argument("--no-verify", action="store_true", help="skip the reload + logits/greedy comparison")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty --out folder (only once the new export has verified)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where to load, merge and verify (auto: CUDA when torch sees a GPU)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from tider.train.export import ExportVerificationError, export_locator

    try:
        report = export_locator(
            args.checkpoint,
            args.out,
            dtype=args.dtype,
            base_model=args.base_model,
            granularity=args.granularity,
            data_hash=args.data_hash,
            verify=not args.no_verify,
            overwrite=args.overwrite,
            device=args.device,
        )
    except ExportVerificationError as exc:
        # The comparison is the diagnosis: print it as a success would be, then say why it failed.
        print(json.dumps(exc.report.to_json(), indent=2))
        print(exc)
        return 1
    print(json.dumps(report.to_json(), indent=2))
    return 0
