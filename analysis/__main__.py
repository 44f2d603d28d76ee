"""``python -m analysis <command>``: validate against vLLM ground truth, summarize a sweep."""

from __future__ import annotations

import argparse
import sys

from engine.specs import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis")
    sub = parser.add_subparsers(dest="command", required=True)
    from analysis import validate

    validate.add_arguments(sub.add_parser(
        "validate", help="replay a vLLM run (ground-truth folder or vllm bench serve result) "
        "and compare"))
    from analysis import run_scenario

    run_scenario.add_arguments(
        sub.add_parser("scenario", help="run a reference (LLMServingSim) cluster config")
    )
    report = sub.add_parser("report", help="HTML report of a capacity study")
    report.add_argument("study_dir")
    report.add_argument("rest", nargs=argparse.REMAINDER)
    summarize = sub.add_parser("summarize", help="print a sweep's results table and plot")
    summarize.add_argument("sweep_dir")
    summarize.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "validate":
            return validate.main(args)
        if args.command == "scenario":
            return run_scenario.main(args)
        if args.command == "report":
            from capacity.report import main as report_main

            return int(report_main([args.study_dir, *args.rest]) or 0)
        if args.command == "summarize":
            from sweep.summarize import main as summarize_main

            return int(summarize_main([args.sweep_dir, *args.rest]) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
