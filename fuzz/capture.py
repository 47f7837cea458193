#!/usr/bin/env python3
"""Records real AMQP traffic and turns it into seed corpora for the fuzz targets.

    fuzz/capture.py LISTEN_PORT_FILE EMULATOR_PORT OUT_DIR      (proxy; runs until killed)
    fuzz/capture.py --seeds OUT_DIR CORPUS_DIR                  (split captures into seeds)

The proxy listens on an ephemeral loopback port (written to LISTEN_PORT_FILE), forwards every
connection to the emulator, and writes each connection's two byte streams to OUT_DIR as
<n>.c2s and <n>.s2c. Point a client's connection string at the proxy's port. `--seeds` then
writes, per target directory under CORPUS_DIR: every frame (frame), every client stream after
its protocol header with a phase byte (emulator_connection), every message a client sent
(emulator_nodes), every message the emulator sent with its delivery tag (client_decode).
"""
import hashlib
import os
import socket
import sys
import threading


def pump(src, dst, log):
    with open(log, "wb") as out:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            out.write(data)
            out.flush()
            try:
                dst.sendall(data)
            except OSError:
                break
    for s in (dst,):
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def proxy(port_file, upstream, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    with open(port_file, "w") as f:
        f.write(str(listener.getsockname()[1]))
    n = 0
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(("127.0.0.1", upstream))
        n += 1
        base = os.path.join(out_dir, str(n))
        threading.Thread(target=pump, args=(client, server, base + ".c2s"), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, base + ".s2c"), daemon=True).start()


def value_len(b, i=0, depth=0):
    """Length of the AMQP value at b[i:] (constructors and size prefixes only)."""
    code = b[i]
    if code == 0x00:
        d = value_len(b, i + 1, depth + 1)
        return 1 + d + value_len(b, i + 1 + d, depth + 1)
    width = {0x4: 1, 0x5: 2, 0x6: 3, 0x7: 5, 0x8: 9, 0x9: 17}.get(code >> 4)
    if width:
        return width
    if code >> 4 in (0xA, 0xC, 0xE):
        return 2 + b[i + 1]
    return 5 + int.from_bytes(b[i + 1:i + 5], "big")


def frames(stream):
    """(raw frame, body) for every frame of a stream, skipping protocol headers."""
    i = 0
    while i + 8 <= len(stream):
        if stream[i:i + 4] == b"AMQP":
            i += 8
            continue
        size = int.from_bytes(stream[i:i + 4], "big")
        if size < 8 or i + size > len(stream):
            return
        raw = stream[i:i + size]
        yield raw, raw[raw[4] * 4:]
        i += size


def transfers(stream):
    """(delivery tag, payload) of every transfer frame with a payload."""
    for raw, body in frames(stream):
        if raw[5] != 0 or len(body) < 3 or body[:3] != b"\x00\x53\x14":
            continue
        try:
            n = value_len(body)
        except IndexError:
            continue
        tag = b""
        # transfer fields: handle, delivery-id, delivery-tag (vbin8 after two values)
        try:
            list_start = 3
            code = body[list_start]
            j = list_start + (3 if code == 0xC0 else 9 if code == 0xD0 else 1)
            j += value_len(body, j)
            j += value_len(body, j)
            if body[j] == 0xA0:
                tag = body[j + 2:j + 2 + body[j + 1]]
        except IndexError:
            pass
        if len(body) > n:
            yield tag, body[n:]


def write(dir_, data):
    os.makedirs(dir_, exist_ok=True)
    with open(os.path.join(dir_, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def seeds(capture_dir, corpus):
    for name in sorted(os.listdir(capture_dir)):
        with open(os.path.join(capture_dir, name), "rb") as f:
            stream = f.read()
        for raw, _ in frames(stream):
            write(os.path.join(corpus, "frame"), raw)
        if name.endswith(".c2s") and len(stream) > 8:
            phase = b"\x00" if stream[:8] == b"AMQP\x03\x01\x00\x00" else b"\x01"
            write(os.path.join(corpus, "emulator_connection"), phase + stream[8:])
            for _, payload in transfers(stream):
                write(os.path.join(corpus, "emulator_nodes"), payload)
        if name.endswith(".s2c"):
            for tag, payload in transfers(stream):
                write(os.path.join(corpus, "client_decode"), bytes([len(tag)]) + tag + payload)


if __name__ == "__main__":
    if sys.argv[1] == "--seeds":
        seeds(sys.argv[2], sys.argv[3])
    else:
        proxy(sys.argv[1], int(sys.argv[2]), sys.argv[3])
