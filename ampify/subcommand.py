"""What `ampify verify` and `ampify bench` share: everything after `--` goes to the user's script."""
import sys
from typing import List, Optional

import typer


def run_with_script_args(app: typer.Typer, argv: Optional[List[str]], prog_name: str) -> int:
    """Run the typer `app` with `argv` (the script's own arguments, after `--`, reach the command as
    `ctx.obj["script_args"]`) and return its exit code instead of exiting."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: List[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, script_args = argv[:split], argv[split + 1:]
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name=prog_name, standalone_mode=True, obj={"script_args": script_args})
    except SystemExit as exit_request:  # typer ends with sys.exit; the caller wants the code back
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
