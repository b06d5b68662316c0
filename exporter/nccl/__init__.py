"""NCCL's RAS (docs/nccl.md): what every NCCL process since 2.24 answers on localhost:28028, read
safely. Data flows one way:

- `procfs`: a job's processes as procfs shows them (NCCL_RAS_ADDR, listening sockets and who owns
  them, NSpid, the libnccl version mapped), read under the configurable procfs root;
- `netns`: a socket opened in a job process's network namespace (the seam tests replace);
- `client`: one RAS session (CLIENT PROTOCOL, TIMEOUT, SET FORMAT, STATUS) under one deadline and a
  byte cap;
- `parse_json`, `parse_text`: pure, strict parsers of the two report formats into `model`;
- `findings`: what a report says about the job (ranks behind, missing and dead peers, errors),
  the same from either format;
- `election`: which node of a job queries (one STATUS per job per interval, cluster-wide).
"""
