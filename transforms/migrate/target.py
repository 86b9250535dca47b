"""The migration target: deprecated mixed precision APIs rewritten to their current equivalents."""

from ampify.transforms.base import Target, TargetOption
from ampify.transforms.migrate.torch_amp_migration import TorchAmpMigration

MIGRATE_TARGET = Target(
    name="torch-migrate",
    description="deprecated torch.cuda.amp / torch.cpu.amp and apex amp rewritten to torch.amp",
    transform=TorchAmpMigration(),
    # on by default: a deprecated API is code to fix, and `--check` fails on it
    runs_when=lambda options: options.migrate,
    options=(
        TargetOption(
            field="migrate",
            flag="--no-migrate",
            config_key="migrate",
            help="Leave deprecated torch.cuda.amp / torch.cpu.amp and apex amp code as it is (migrated to torch.amp by default).",
        ),
    ),
    rule_prefix="AMP4",
    verify="torch",
    fixtures="migrate",
)
