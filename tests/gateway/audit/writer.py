"""A gateway's audit trail in a process of its own, for the crash and restart tests.

It builds the trail as `tenantgate serve` does (`gateway.app.build_audit`, TENANTGATE_*
settings) and obeys lines on stdin, answering each on stdout:

    write N              N records; answers "seq S" (the next seq)
    limit-file-size N    RLIMIT_FSIZE soft limit in bytes (-1: back to the hard limit), as a full disk
    (end of input)       the shutdown `tenantgate serve` does: close the trail; answers "closed"

SIGKILL is the crash. With AUDIT_WRITER_AS_POD=NAME it runs as a container would: host
name NAME and process id 1, on every boot.

    python -m tests.gateway.audit.writer
"""

from __future__ import annotations

import os
import resource
import socket
import sys

if os.environ.get("AUDIT_WRITER_AS_POD"):
    pod = os.environ["AUDIT_WRITER_AS_POD"]
    socket.gethostname = lambda: pod
    os.getpid = lambda: 1


def main() -> None:
    from gateway.app import build_audit
    from gateway.metrics import GatewayMetrics
    from gateway.settings import Settings

    recorder = build_audit(Settings(), GatewayMetrics())
    print(f"chain {recorder.trail.chain_id}", flush=True)
    written = 0
    for line in sys.stdin:
        command, argument = line.split()
        if command == "write":
            for _ in range(int(argument)):
                recorder.write({"request_id": f"req-{written}", "status": 200, "outcome": "completed"})
                written += 1
            print(f"seq {recorder.trail.seq}", flush=True)
        elif command == "limit-file-size":
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard if int(argument) < 0 else int(argument), hard))
            print("limited", flush=True)
    recorder.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
