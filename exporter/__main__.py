from exporter.cli import console_main

console_main()
