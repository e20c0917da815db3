"""Client.watch over a real dropped connection: the client reaches a real coordinator through a
TCP proxy that closes the connection once, mid-job; the iterator reconnects and goes on, and
yields every step exactly once, in order. (test_watch.py scripts the failures on a fake
servicer; this is the transport failing for real.)"""
import os
import socket
import threading

import meshrun
from conftest import EXAMPLES
from meshrun.v1 import job_pb2


class DroppingProxy:
    """Forwards each loopback TCP connection to `target`, one thread per direction. drop()
    closes every open connection at once, both sides, as a failed network path would; later
    connections are forwarded again."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                return  # closed
            with self._lock:
                self.connections += 1
                self._open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        _shut(dst)  # one side ended: so does the other

    def drop(self):
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            _shut(s)  # wakes the pipe threads blocked in recv
            s.close()

    def close(self):
        self._listener.close()
        self.drop()


def _shut(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def test_watch_resumes_after_the_connection_drops_mid_job(cluster):
    steps, drop_after = 1500, 20
    proxy = DroppingProxy(cluster.address)
    job_id = cluster.client.submit(os.path.join(EXAMPLES, "mlp_classifier", "dp1"), steps=steps,
                                   cadence=1)
    seen, running_at_drop = [], None
    try:
        with meshrun.Client(proxy.address, timeout=10) as client:
            for summary in client.watch(job_id, names=["loss"]):
                assert not summary.HasField("rewind")
                seen.append(summary.step)
                if summary.step == drop_after:
                    # The job as the coordinator has it (directly, not through the proxy).
                    running_at_drop = cluster.client.get(job_id)
                    proxy.drop()
    finally:
        proxy.close()
    manifest = cluster.client.wait(job_id, timeout=120)
    assert job_pb2.JobState.Name(manifest.state) == "JOB_STATE_SUCCEEDED", cluster.logs()
    # The drop came mid-job, and broke the stream: the client had to connect again.
    # (LOADING until every host's StartJob returned: a loaded machine may already step then.)
    assert job_pb2.JobState.Name(running_at_drop.state) in ("JOB_STATE_LOADING",
                                                            "JOB_STATE_RUNNING")
    assert running_at_drop.last_step < steps, running_at_drop
    assert proxy.connections >= 2
    # Every step once, in order: nothing lost in the drop, nothing resent after it.
    assert len(seen) == len(set(seen)), [s for s in seen if seen.count(s) > 1][:10]
    assert seen == list(range(1, steps + 1)), (seen[:5], seen[-5:], len(seen))
