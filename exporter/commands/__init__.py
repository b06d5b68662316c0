"""Subcommands besides serving (`check`, `ack`): each module defines `HELP`,
`add_arguments(parser)` and `run(args, ctx) -> int`, and is discovered automatically."""
