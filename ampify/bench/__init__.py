"""`ampify bench SCRIPT [-- ARGS]`: run the fp32 script and its ampify conversion side by side and
report what mixed precision buys on this machine (cli.py, runner.py, hardware.py, report.py)."""
