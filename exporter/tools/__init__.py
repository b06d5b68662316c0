"""The project's tools, shipped in the same wheel but never imported by the served exporter
(tests/test_runtime_imports.py): the simulated node (`simulate`, loaded by `--simulate` and
`--list-scenarios` only), the generators of every generated file (`python -m
exporter.tools.generate`: docs, deploy manifests, the Helm chart, the job-health rules) and the
release builder (`python -m exporter.tools.release`). They may import the runtime package; the
runtime package imports them only lazily, in the command that needs them."""
