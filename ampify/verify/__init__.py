"""`ampify verify`: run a patched script and prove that mixed precision engaged.

Data flows one way, one module per step:

    detect.py          framework/backend from the script's text (no TF/torch import here)
    runner.py          runs `python probes/_ampify_probe_main.py SCRIPT ARGS` in its own process group
    probes/            stdlib-only modules started before the script inside the user's interpreter;
                       they hook TF Sessions / torch ops on import and write evidence.json
    output_parsing.py  grappler's "Converted N/M nodes" line, torch's warnings, traceback last line
    judge.py           evidence -> verified | not_active | script_failed | cannot_verify + reason
    report.py          verdict lines, tables, JSON, combined exit code
    cli.py             the typer command (`ampify verify`, `python -m ampify.verify`)
"""
