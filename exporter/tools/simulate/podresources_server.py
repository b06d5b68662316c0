"""A kubelet pod-resources v1 server (List only) on a unix socket, for the simulated node and the
benchmarks: gRPC over HTTP/2 on the `h2` library, the answer encoded with the committed protobuf
module (exporter/workload/podresources/api_pb2).

It runs in a process of its own, as a real kubelet does, so the exporter's threads and memory are
its own (docs/performance.md): `PodResourcesServer` starts

    python -m exporter.tools.simulate.podresources_server SOCKET PODS_JSON

which binds SOCKET, prints `ready`, serves until its stdin closes (its parent exited, however it
exited) and removes SOCKET. PODS_JSON: [[namespace, pod, container, resource, [device ids]], ...].
Connections are served together on one thread (a selector), each call answered whole."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
from collections.abc import Callable

Pods = list[tuple[str, str, str, str, list[str]]]
LIST = "/v1.PodResourcesLister/List"


def encode(pods: Pods) -> bytes:
    """The ListPodResourcesResponse listing `pods`."""
    from exporter.workload.podresources import api_pb2

    resp = api_pb2.ListPodResourcesResponse()
    for ns, pod, container, resource, ids in pods:
        p = resp.pod_resources.add(name=pod, namespace=ns)
        p.containers.add(name=container).devices.add(resource_name=resource, device_ids=ids)
    return resp.SerializeToString()


class _Connection:
    """One client's HTTP/2 connection: every call on it answered whole."""

    def __init__(self, sock: socket.socket, answer: Callable[[str], tuple[int, bytes]]) -> None:
        import h2.config
        import h2.connection

        self.sock, self.answer = sock, answer
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        self.paths: dict[int, str] = {}
        self.pending: dict[int, bytes] = {}  # stream -> response bytes not yet sent (flow control)
        self.sock.sendall(self.h2.data_to_send())

    def readable(self) -> bool:
        """Read and answer what came; False once the client has gone."""
        import h2.events

        data = self.sock.recv(65536)
        if not data:
            return False
        h2c = self.h2
        for ev in h2c.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                self.paths[ev.stream_id] = dict(ev.headers).get(":path", "")
            elif isinstance(ev, h2.events.DataReceived):
                h2c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                status, body = self.answer(self.paths.pop(ev.stream_id, ""))
                if status:  # Trailers-Only: the status in the headers
                    h2c.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "application/grpc"),
                                                    ("grpc-status", str(status))], end_stream=True)
                else:
                    h2c.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                    self.pending[ev.stream_id] = b"\x00" + len(body).to_bytes(4, "big") + body
        for sid in list(self.pending):
            chunk = self.pending[sid]
            while chunk:
                n = min(len(chunk), h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size)
                if n <= 0:
                    break
                h2c.send_data(sid, chunk[:n])
                chunk = chunk[n:]
            if chunk:
                self.pending[sid] = chunk
            else:
                del self.pending[sid]
                h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        self.sock.sendall(h2c.data_to_send())
        return True


def serve(path: str, pods: Pods) -> None:
    """Serve List on `path` until stdin is readable (closed: the parent is done)."""
    body = encode(pods)

    def answer(method: str) -> tuple[int, bytes]:
        return (0, body) if method == LIST else (12, b"")  # 12: UNIMPLEMENTED

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                if key.fileobj is sys.stdin:
                    return
                if key.fileobj is listener:
                    sock, _ = listener.accept()
                    sock.settimeout(5)  # a client that stops reading is dropped, never waited on
                    try:
                        sel.register(sock, selectors.EVENT_READ, _Connection(sock, answer))
                    except OSError:
                        sock.close()
                    continue
                conn: _Connection = key.data
                try:
                    alive = conn.readable()
                except Exception:  # noqa: BLE001 - one bad client never stops the server
                    alive = False
                if not alive:
                    sel.unregister(conn.sock)
                    conn.sock.close()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


class PodResourcesServer:
    """The server above in a child process; `stop()` ends it."""

    def __init__(self, socket_path: str, pods: Pods) -> None:
        # It writes to the exporter's stderr, but its import log (PYTHONPROFILEIMPORTTIME) is not
        # the exporter's: tests/test_runtime_imports.py reads that log as what the exporter imported.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.tools.simulate.podresources_server", socket_path,
             json.dumps(pods)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the simulated kubelet did not start on {socket_path}")

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


if __name__ == "__main__":
    serve(sys.argv[1], [tuple(p) for p in json.loads(sys.argv[2])])  # type: ignore[misc]
