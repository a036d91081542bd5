"""Delay packets by holding them in an NFQUEUE: the latency half of `tc netem`, for kernels built
without sch_netem (this project's CI machines: `tc qdisc add ... netem` answers "Specified qdisc
kind is unknown"). Loss is iptables' `statistic` match, which every kernel with xtables has.

    ip netns exec HOST python -m tests.faults.nfdelay --queue 0 --delay-ms 80 --jitter-ms 20
    ip netns exec HOST iptables -A OUTPUT -d DB -j NFQUEUE --queue-num 0 --queue-bypass

The iptables rule sends the link's packets to queue 0; this process gives each one its verdict
(accept) once its delay has passed. Verdicts go out by packet id, so packets keep their order only
as far as their delays do, as with netem's jitter. `--queue-bypass` lets packets through
untouched whenever no process holds the queue, so a crashed delayer never cuts the link.

Speaks nfnetlink_queue directly over a netlink socket (no libnetfilter_queue binding needed);
only the packet id is copied to user space, never the packet.
"""

import argparse
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    # nfgenmsg: family (AF_UNSPEC), version 0, resource id (the queue number, big-endian).
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


class Queue:
    def __init__(self, number: int):
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, 0)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))

    def _config(self, attrs: bytes) -> None:
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.number, attrs, NLM_F_REQUEST | NLM_F_ACK))
        data = self.sock.recv(65536)
        _, kind, _, _, _ = struct.unpack_from("=IHHII", data)
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, 16)
            if error:
                raise OSError(-error, f"nfqueue config: {os.strerror(-error)}")

    def packet_ids(self):
        """The ids of the packets in what one recv returned."""
        data = self.sock.recv(1 << 20)
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                a = offset + 20  # past nlmsghdr and nfgenmsg
                while a + 4 <= offset + length:
                    alen, akind = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if (akind & 0x7FFF) == NFQA_PACKET_HDR:
                        yield struct.unpack_from("!I", data, a + 4)[0]
                    a += (alen + 3) & ~3
            offset += (length + 3) & ~3

    def accept(self, packet_id: int) -> None:
        self.sock.send(_message(NFQNL_MSG_VERDICT, self.number,
                                _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))))

    def close(self) -> None:
        try:
            self._config(_attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_UNBIND, 0)))
        finally:
            self.sock.close()


def serve(queue: Queue, delay: float, jitter: float, stop) -> int:
    held = []  # (release time, packet id)
    passed = 0
    rng = random.Random()
    while not stop():
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
        ready, _, _ = select.select([queue.sock], [], [], timeout)
        if ready:
            now = time.monotonic()
            for pid in queue.packet_ids():
                heapq.heappush(held, (now + max(0.0, rng.uniform(delay - jitter, delay + jitter)), pid))
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.accept(heapq.heappop(held)[1])
            passed += 1
    for _, pid in held:
        queue.accept(pid)
    return passed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *a: stopping.append(1))
    q = Queue(args.queue)
    print(f"nfdelay: queue {args.queue}, {args.delay_ms:.0f} ms ± {args.jitter_ms:.0f} ms", flush=True)
    passed = serve(q, args.delay_ms / 1000, args.jitter_ms / 1000, lambda: bool(stopping))
    q.close()
    print(f"nfdelay: {passed} packets delayed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
