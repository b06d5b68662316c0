import signal

# SIGHUP asks the daemon to reload; until serve() takes it, hold it pending rather than let its
# default action end the process during start-up (see exporter.lifecycle.hold_sighup).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})

from exporter.cli import console_main  # noqa: E402

console_main()
