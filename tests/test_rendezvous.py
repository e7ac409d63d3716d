"""test_rendezvous.py: the rendezvous of --dist-init (llmc/rendezvous.h) against hostile and mistaken peers
(issue 38), fast: build/rendezvous_peer is one rank of it without the trainer, and the hostile peers are
a few lines of Python sockets speaking the protocol of llmc/rendezvous_proto.h, written here again from
its header comment (so the C side is checked against a second implementation, and SHA-256 and HMAC
against hashlib and hmac). Every case ends in a clear error within LLMC_DIST_TIMEOUT (plus SLACK_S), or
the right ranks meet and hold the same id; never a crash, a sanitizer report or a hang.

    python3 tests/test_rendezvous.py ./build/rendezvous_peer ./test_gpt
"""

import hashlib
import hmac
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

import e2e

PEER, TESTER = e2e.usage(sys.argv, ["./build/rendezvous_peer", "./test_gpt"])
s = e2e.Suite("test_rendezvous", tester=TESTER, run_limit=60)
SECRET = "test-secret-0123456789"
TIMEOUT = 3           # LLMC_DIST_TIMEOUT of the cases that end in a timeout
SLACK_S = 2.5         # what a rank may take past its timeout to stop (the sanitizers' start, a loaded machine)
ID_BYTES = 128
os.environ["LLMC_DIST_SECRET"] = SECRET
os.environ["LLMC_DIST_TIMEOUT"] = "20"
for v in ("LLMC_DIST_SECRET_FILE", "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"):
    os.environ.pop(v, None)

# ----------------------------------------------------------------------------
# the protocol, from llmc/rendezvous_proto.h's header comment

MAGIC, VERSION, NONCE = 0x6C6C6D63, 2, 16
HELLO, ANSWER, ACK, WELCOME = 1, 2, 3, 4
LABELS = {HELLO: b"llmc rendezvous hello", ANSWER: b"llmc rendezvous answer", ACK: b"llmc rendezvous ack", WELCOME: b"llmc rendezvous welcome"}
OK, BAD_PROOF, WRONG_WORLD = 0, 1, 2
HELLO_BYTES, ACK_BYTES = 84, 48


def answer_bytes(n):
    return 88 + n


def keys(secret):
    secret = secret.encode()
    return (hmac.new(secret, b"llmc rendezvous mac key", hashlib.sha256).digest(),
            hmac.new(secret, b"llmc rendezvous stream key", hashlib.sha256).digest())


def seal(k, transcript, kind, body):
    return body + hmac.new(k[0], LABELS[kind] + transcript + body, hashlib.sha256).digest()


def header(kind):
    return struct.pack("<III", MAGIC, VERSION, kind)


def hello(k, rank, world, settings=0, job=0, nonce=None):
    return seal(k, b"", HELLO, header(HELLO) + struct.pack("<IIQQ", rank, world, settings, job) + (nonce or os.urandom(NONCE)))


def keystream(k, peer_nonce, rank0_nonce, n):
    out = b""
    for block in range((n + 31) // 32):
        out += hmac.new(k[1], peer_nonce + rank0_nonce + struct.pack("<I", block), hashlib.sha256).digest()
    return out[:n]


def parse_answer(k, hello_msg, msg, n=ID_BYTES):
    """(status, id or None, MAC right)"""
    status = struct.unpack_from("<I", msg, 12)[0]
    nonce0 = msg[36:52]
    right = hmac.compare_digest(seal(k, hello_msg, ANSWER, msg[:-32])[-32:], msg[-32:])
    sealed = msg[56:56 + n]
    plain = bytes(a ^ b for a, b in zip(sealed, keystream(k, hello_msg[36:52], nonce0, n))) if status == OK else None
    return status, plain, right, sealed


def recv_all(sock, n, limit=5.0):
    sock.settimeout(limit)
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


# ----------------------------------------------------------------------------
# runs

def free_port():
    with socket.socket() as k:
        k.bind(("127.0.0.1", 0))
        return k.getsockname()[1]


def start(method, rank, world, settings="0", env=None):
    """one rank of build/rendezvous_peer, started"""
    full = dict(os.environ, **(env or {}))
    p = subprocess.Popen([PEER, method, str(rank), str(world), settings], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=full, start_new_session=True)
    p.t0 = time.monotonic()
    return p


def finish(p, limit=30):
    """(rc, stdout, stderr, seconds) of a started rank (killed at LIMIT: a hang)"""
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        e2e.kill_group(p)
        out, err = p.communicate()
        return None, out, err + "\n(hung: killed)", time.monotonic() - p.t0
    return p.returncode, out, err, time.monotonic() - p.t0


def the_id(out):
    return [line[3:] for line in out.splitlines() if line.startswith("id ")]


def clean_error(r, phrase):
    """a fail() of its own: exit 1, 'error: ', the phrase, the (at file:line), no sanitizer report"""
    rc, _, err, _ = r
    if rc != 1:
        return f"exit code {rc} (1 expected: a fail()): {err[-600:]}"
    if "error: " not in err or phrase not in err or not e2e.FAIL_LOCATION_RE.search(err):
        return f"stderr lacks '{phrase}' or fail()'s form: {err[-600:]}"
    return None


def expect_error(name, p, phrase, within=None):
    r = finish(p)
    bad = clean_error(r, phrase)
    if bad is None and within is not None and r[3] > within:
        bad = f"stopped after {r[3]:.1f} s, more than {within:.1f}"
    s.check(name, bad is None, bad)
    return r


def expect_meet(name, procs):
    """every rank exits 0 and holds rank 0's id"""
    rs = [finish(p) for p in procs]
    ids = [the_id(r[1]) for r in rs]
    ok = all(r[0] == 0 for r in rs) and all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 1
    s.check(name, ok, " | ".join(f"rc {r[0]}: {r[2][-300:]}" for r in rs))
    return rs


def expect_refused_then_meet(name, port, hostile, world=2, phrase=None, settle=0.3):
    """rank 0 on PORT; HOSTILE(port) does its worst; then the real ranks meet (and, with PHRASE, a timeout
    run alone says it refused the hostile peer that way)"""
    r0 = start(f"tcp:127.0.0.1:{port}", 0, world)
    time.sleep(settle)
    hostile(port)
    peers = [start(f"tcp:127.0.0.1:{port}", r, world) for r in range(1, world)]
    expect_meet(f"{name}: rank 0 survives it and the real ranks meet", [r0] + peers)
    if phrase:
        port = free_port()
        r0 = start(f"tcp:127.0.0.1:{port}", 0, world, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)})
        time.sleep(settle)
        hostile(port)
        expect_error(f"{name}: alone, rank 0 stops at its timeout naming the refusal", r0, phrase, TIMEOUT + SLACK_S)


def connect(port):
    for _ in range(200):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


# ----------------------------------------------------------------------------
# SHA-256 and HMAC-SHA256 (llmc/hmac_sha256.h) against hashlib and hmac

bad = []
for msg_len in (0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 127, 128, 129, 1000):
    for key_len in (0, 1, 16, 32, 63, 64, 65, 200):
        key, msg = os.urandom(key_len), os.urandom(msg_len)
        out = subprocess.run([PEER, "--hmac", key.hex() or "", msg.hex() or ""], capture_output=True, text=True).stdout.split()
        want = ["sha256", hashlib.sha256(msg).hexdigest(), "hmac", hmac.new(key, msg, hashlib.sha256).hexdigest()]
        if out != want:
            bad.append(f"key {key_len} B, message {msg_len} B: {out} vs {want}")
s.check("SHA-256 and HMAC-SHA256 equal hashlib's and hmac's (messages 0..1000 bytes around the block, keys 0..200)", not bad, "; ".join(bad[:3]))

# ----------------------------------------------------------------------------
# the method and the secret, checked before anything waits (15, and the secret's rules)

for port in ("0", "99999", "65536", "abc", "-1", "+80", "80x", ""):
    expect_error(f"tcp:127.0.0.1:{port or '(empty)'}: refused, port not a number in 1..65535",
                 start(f"tcp:127.0.0.1:{port}", 0, 2), "is not a number in 1..65535", 2)
no_secret = {k: v for k, v in os.environ.items() if k != "LLMC_DIST_SECRET"}


def start_env(method, rank, world, env):
    """one rank with exactly the environment ENV"""
    p = subprocess.Popen([PEER, method, str(rank), str(world)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    p.t0 = time.monotonic()
    return p


for rank in (0, 1):
    expect_error(f"tcp: without a secret, rank {rank} stops at once with a hint that makes one",
                 start_env(f"tcp:127.0.0.1:{free_port()}", rank, 2, no_secret), "head -c 16 /dev/urandom", 2)
expect_error("LLMC_DIST_SECRET of 15 characters: refused", start(f"tcp:127.0.0.1:{free_port()}", 0, 2, env={"LLMC_DIST_SECRET": "x" * 15}),
             "the job's secret needs 16")
secret_file = s.path("secret.txt")
with open(secret_file, "w") as f:
    f.write(SECRET + "\n")
os.chmod(secret_file, 0o644)
expect_error("LLMC_DIST_SECRET_FILE readable by others: refused", start_env(f"tcp:127.0.0.1:{free_port()}", 0, 2,
             dict(no_secret, LLMC_DIST_SECRET_FILE=secret_file)), "that group and others cannot read")
os.chmod(secret_file, 0o600)
port = free_port()
expect_meet("LLMC_DIST_SECRET_FILE (mode 600, a newline at the end) on one rank, LLMC_DIST_SECRET on the other: they meet",
            [start_env(f"tcp:127.0.0.1:{port}", 0, 2, dict(no_secret, LLMC_DIST_SECRET_FILE=secret_file)), start(f"tcp:127.0.0.1:{port}", 1, 2)])
expect_error("both LLMC_DIST_SECRET and LLMC_DIST_SECRET_FILE: refused", start(f"tcp:127.0.0.1:{free_port()}", 0, 2,
             env={"LLMC_DIST_SECRET_FILE": secret_file}), "which is the job's secret")
expect_error("tcp: HOST that is not this machine's: rank 0 says it cannot listen there", start("tcp:192.0.2.1:29600", 0, 2),
             "cannot listen on 192.0.2.1")

# the protocol written here from the header meets the C one: a Python rank 1 reads rank 0's id
port = free_port()
r0 = start(f"tcp:127.0.0.1:{port}", 0, 2)
k = keys(SECRET)
with connect(port) as c:
    h = hello(k, 1, 2)
    c.sendall(h)
    a = recv_all(c, answer_bytes(ID_BYTES))
    status, got_id, right, _ = parse_answer(k, h, a)
    transcript = h + a
    c.sendall(seal(k, transcript, ACK, header(ACK) + struct.pack("<I", 1)))
    w = recv_all(c, 48)
rc, out, err, _ = finish(r0)
s.check("a Python rank 1 (the protocol from the header) is welcomed and decrypts rank 0's id", rc == 0 and status == OK and right and
        got_id is not None and the_id(out) == [got_id.hex()] and len(w) == 48, f"rc {rc} status {status} mac {right}: {err[-300:]}")

# ----------------------------------------------------------------------------
# 1. a rank outside 1..world-1 (or the old 8-byte hello): dropped, nothing indexed by it

for rank in (0x80000000, 0xFFFFFFFF, 0, 2):
    def bad_rank(port, rank=rank):
        with connect(port) as c:
            c.sendall(hello(keys(SECRET), rank, 2))  # the right secret even: the range is checked first
            reply = recv_all(c, 1, 1.0)
        s.check(f"rank {rank:#x}: no answer, the connection closed", reply == b"", f"answered {reply!r}")
    expect_refused_then_meet(f"HELLO of rank {rank:#x} of 2", free_port(), bad_rank, phrase="not a rank that asks")


def old_hello(port):
    with connect(port) as c:
        c.sendall(struct.pack("<II", MAGIC, 0x80000000))
        time.sleep(0.1)


expect_refused_then_meet("the old 8-byte message (magic, rank 0x80000000) that killed rank 0", free_port(), old_hello,
                         phrase="it closed the connection after 8 of 84 bytes")


def garbage(port):
    with connect(port) as c:
        c.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(100))
        time.sleep(0.1)


expect_refused_then_meet("a stray client's garbage", free_port(), garbage, phrase="not a rendezvous message")

# ----------------------------------------------------------------------------
# 2. silent connections: never block the others; alone, rank 0 still stops at its timeout

silent = []
expect_refused_then_meet("three silent connections held open", free_port(), lambda port: silent.extend(connect(port) for _ in range(3)))
port = free_port()
r0 = start(f"tcp:127.0.0.1:{port}", 0, 2, env={"LLMC_DIST_TIMEOUT": "7"})
time.sleep(0.3)
silent.append(connect(port))
expect_error("a silent connection alone: dropped after the per-connection deadline, rank 0 stops at its timeout naming it", r0,
             "0 bytes of its HELLO in 5 s, then nothing (dropped)", 7 + SLACK_S)
for c in silent:
    c.close()
port = free_port()
fake = socket.socket()
fake.bind(("127.0.0.1", port))
fake.listen(4)
expect_error("a silent listener in rank 0's place: rank 1 stops at its timeout, saying it never answered",
             start(f"tcp:127.0.0.1:{port}", 1, 2, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)}), "no answer in time", TIMEOUT + SLACK_S + 5)
fake.close()

# ----------------------------------------------------------------------------
# 3. taking a rank's place without the secret: no id, no place


def thief(port):
    k_wrong = keys("not-the-secret-0123456")
    with connect(port) as c:
        h = hello(k_wrong, 1, 2)
        c.sendall(h)
        a = recv_all(c, answer_bytes(ID_BYTES))
        status, _, right, sealed = parse_answer(k_wrong, h, a)
        c.sendall(seal(k_wrong, h + a, ACK, header(ACK) + struct.pack("<I", 1)))
        more = recv_all(c, 48, 1.0)
    s.check("a peer without the secret gets BAD_PROOF, no id (zeros) and an answer it cannot verify, and no welcome",
            status == BAD_PROOF and not right and sealed == bytes(ID_BYTES) and more == b"", f"status {status} mac {right} welcome {more!r}")


expect_refused_then_meet("a peer of rank 1 without the secret", free_port(), thief, phrase="wrong secret")


def replay(port):
    """a HELLO of the real secret recorded and sent again: the answer is unreadable without the secret, and
    without a valid ACK (which needs the secret) the place is never taken"""
    k = keys(SECRET)
    h = hello(k, 1, 2)
    with connect(port) as c:
        c.sendall(h)
        a = recv_all(c, answer_bytes(ID_BYTES))
        c.sendall(header(ACK) + struct.pack("<I", 1) + os.urandom(32))  # the thief cannot make the MAC
        more = recv_all(c, 48, 1.0)
    s.check("a replayed HELLO: the id comes encrypted (not the plain bytes), a forged ACK gets no welcome",
            len(a) == answer_bytes(ID_BYTES) and more == b"", f"{len(a)} answer bytes, welcome {more!r}")


expect_refused_then_meet("a replayed HELLO of rank 1 with a forged ACK", free_port(), replay, phrase="its ACK's MAC fails")

# two real processes of rank 1: the first takes the place, the second is refused, naming it
for kind in ("tcp", "file"):
    method = f"tcp:127.0.0.1:{free_port()}" if kind == "tcp" else f"file:{tempfile.mkdtemp(dir=s.root)}"
    r0 = start(method, 0, 3)
    time.sleep(0.2)
    first = start(method, 1, 3)
    time.sleep(1.0)
    expect_error(f"{kind}: a second process of rank 1: refused, naming it", start(method, 1, 3), "rank 1 was taken by another process first", 5)
    expect_meet(f"{kind}: ... and rank 2 then completes the world with the first", [r0, first, start(method, 2, 3)])

# ----------------------------------------------------------------------------
# 4. a process that takes the port first hands out a forged id: the real ranks detect it


def fake_rank0(port, reply):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(4)
    return srv, reply


def serve_once(srv, reply):
    srv.settimeout(10)
    try:
        c, _ = srv.accept()
    except OSError:
        return
    with c:
        h = recv_all(c, HELLO_BYTES)
        c.sendall(reply(h))
        time.sleep(0.5)


k_forger = keys("the-forgers-own-secret-0")
FORGERIES = {
    "a forged answer under another secret": lambda h: seal(k_forger, h, ANSWER, header(ANSWER) + struct.pack("<IIQQ", OK, 2, 0, 0) +
                                                           os.urandom(NONCE) + struct.pack("<I", ID_BYTES) + bytes(ID_BYTES)),
    "the old protocol's raw 128-byte id": lambda h: bytes(range(ID_BYTES)),
    "a forged refusal": lambda h: header(ANSWER) + struct.pack("<IIQQ", WRONG_WORLD, 3, 0, 0) + os.urandom(NONCE) +
    struct.pack("<I", ID_BYTES) + bytes(ID_BYTES) + os.urandom(32),
}
for what, reply in FORGERIES.items():
    port = free_port()
    srv, _ = fake_rank0(port, reply)
    p1 = start(f"tcp:127.0.0.1:{port}", 1, 2)
    serve_once(srv, reply)
    expect_error(f"a fake rank 0 on the port first ({what}): rank 1 stops, it cannot trust it", p1, "cannot trust the process listening there", 5)
    expect_error(f"a fake rank 0 on the port first ({what}): the real rank 0 stops, the port taken", start(f"tcp:127.0.0.1:{port}", 0, 2),
                 "Address already in use", 5)
    srv.close()

# ----------------------------------------------------------------------------
# wrong secret, another job or other settings on the same port (5), another world size (7)

port = free_port()
r0 = start(f"tcp:127.0.0.1:{port}", 0, 2, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)})
time.sleep(0.2)
expect_error("rank 1 with another secret: stops at once, it cannot trust rank 0", start(f"tcp:127.0.0.1:{port}", 1, 2,
             env={"LLMC_DIST_SECRET": "another-secret-9876543"}), "cannot trust the process listening there", 5)
expect_error("... and rank 0 stops at its timeout, naming rank 1 and the wrong secret", r0, "rank 1: wrong secret", TIMEOUT + SLACK_S)

for what, a_env, a_settings, b_env, b_settings, phrase in (
        ("other settings (another seed, lr)", {}, "a1", {}, "b2", "other settings: rank 0's settings hash 00000000000000a1, rank 1's 00000000000000b2"),
        ("another slurm job", {"SLURM_JOB_ID": "100", "SLURM_STEP_ID": "0"}, "0", {"SLURM_JOB_ID": "101", "SLURM_STEP_ID": "0"}, "0", "another job"),
        ("another torchrun run", {"TORCHELASTIC_RUN_ID": "a"}, "0", {"TORCHELASTIC_RUN_ID": "b"}, "0", "another job")):
    port = free_port()
    ra = start(f"tcp:127.0.0.1:{port}", 0, 2, a_settings, env=a_env)
    time.sleep(0.2)
    expect_error(f"job B's rank 1 at job A's rank 0 ({what}): refused at the door, naming it", start(f"tcp:127.0.0.1:{port}", 1, 2, b_settings, env=b_env),
                 phrase, 5)
    expect_meet(f"... and job A's own rank 1 then meets A's rank 0 ({what})", [ra, start(f"tcp:127.0.0.1:{port}", 1, 2, a_settings, env=a_env)])

for world0, rank, world in ((2, 1, 3), (2, 2, 3), (3, 1, 2)):
    port = free_port()
    r0 = start(f"tcp:127.0.0.1:{port}", 0, world0, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)})
    time.sleep(0.2)
    expect_error(f"WORLD_SIZE {world0} on rank 0, {world} on rank {rank}: rank {rank} stops naming both", start(f"tcp:127.0.0.1:{port}", rank, world),
                 f"world size: rank 0's {world0}, rank {rank}'s {world}", 5)
    expect_error(f"... and rank 0 stops at its timeout naming both", r0, f"world size: rank 0's {world0}, rank {rank}'s {world}", TIMEOUT + SLACK_S)

# ----------------------------------------------------------------------------
# file:DIR: with and without a launcher's secret, two jobs in one folder, stale files (6)


def folder():
    d = tempfile.mkdtemp(prefix="rdv_", dir=s.root)
    return d


def files(d):
    return sorted(os.listdir(d))


for label, env in (("the launcher's secret", {}), ("no secret: rank 0 makes one in the folder", {"LLMC_DIST_SECRET": None})):
    d = folder()
    e = {k: v for k, v in os.environ.items() if env.get(k, "") is not None}
    procs = [start_env(f"file:{d}", r, 3, e) for r in (2, 1, 0)]
    expect_meet(f"file: 3 ranks, {label}: they meet", procs)
    s.check(f"file: 3 ranks, {label}: the folder is left empty", files(d) == [], str(files(d)))

# the secret rank 0 makes: mode 600, this user's
d = folder()
r0 = start_env(f"file:{d}", 0, 2, no_secret)
time.sleep(0.5)
made = [f for f in files(d) if f.endswith(".secret")]
mode = stat.S_IMODE(os.stat(os.path.join(d, made[0])).st_mode) if made else None
s.check("file: without a secret rank 0 writes one, mode 600", made and mode == 0o600, f"{files(d)} mode {mode}")
expect_meet("file: ... which rank 1 reads", [r0, start_env(f"file:{d}", 1, 2, no_secret)])

# stale files of a killed run: a secret, HELLOs (of another secret, and garbage), answers, acks, the old protocol's
JOB0 = "llmc_dist.0000000000000000"
for label, env in (("no secret", no_secret), ("the launcher's secret", dict(os.environ))):
    d = folder()
    stale = {f"{JOB0}.secret": ("x" * 40).encode(), f"{JOB0}.hello.1.{'ab' * 16}": hello(keys("old-secret-of-a-dead-run"), 1, 2),
             f"{JOB0}.hello.1.{'cd' * 16}": os.urandom(84), f"{JOB0}.answer.{'ef' * 16}": os.urandom(216),
             f"{JOB0}.ack.{'01' * 16}": os.urandom(48), f"{JOB0}.welcome.{'23' * 16}": os.urandom(48),
             "llmc_dist.want.1": (12345).to_bytes(8, "little"), "llmc_dist.id.3039": bytes(128), "llmc_dist.ack.3039": bytes(8)}
    for name, data in stale.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(d, name), 0o600)
    p1 = start_env(f"file:{d}", 1, 2, env)  # first: it may read the stale secret
    time.sleep(0.5)
    expect_meet(f"file: stale files of a killed run in the folder ({label}): the new pair meets", [start_env(f"file:{d}", 0, 2, env), p1])
    # the stale secret is replaced and removed when rank 0 makes one; with the launcher's secret nobody reads it
    kept = [f for f in stale if ".hello." not in f and (env is not no_secret or not f.endswith(".secret"))]
    s.check(f"file: stale files ({label}): the stale HELLOs are gone (and the stale secret without a launcher's), the rest untouched, nothing new",
            files(d) == sorted(kept), f"{files(d)}")

# two jobs in one folder
d = folder()
a = [start_env(f"file:{d}", r, 2, dict(os.environ, SLURM_JOB_ID="7", SLURM_STEP_ID="0")) for r in (0, 1)]
b = [start_env(f"file:{d}", r, 2, dict(os.environ, SLURM_JOB_ID="8", SLURM_STEP_ID="0")) for r in (1, 0)]
ra, rb = expect_meet("file: two slurm jobs in one folder: job A's ranks meet", a), expect_meet("... and job B's", b)
s.check("... each with its own id", ra and rb and the_id(ra[0][1]) != the_id(rb[0][1]), "the same id")
d = folder()
ra = start(f"file:{d}", 0, 2, "a1")
time.sleep(0.3)
expect_error("file: job B's rank 1 (other settings, the same secret) in job A's folder: refused, naming it",
             start(f"file:{d}", 1, 2, "b2"), "other settings: rank 0's settings hash 00000000000000a1, rank 1's 00000000000000b2", 5)
expect_meet("... and job A's rank 1 then meets A's rank 0", [ra, start(f"file:{d}", 1, 2, "a1")])
d = folder()
ra = start_env(f"file:{d}", 0, 2, dict(no_secret, LLMC_DIST_TIMEOUT=str(TIMEOUT)))
time.sleep(0.5)
rb = start_env(f"file:{d}", 0, 2, no_secret)
expect_error("file: two jobs without a job key or secret in one folder: the first rank 0 stops, its secret replaced", ra,
             "two jobs meet in this folder at once", 5)
expect_meet("... and the second job meets", [rb, start_env(f"file:{d}", 1, 2, no_secret)])
d = folder()
r0 = start(f"file:{d}", 0, 2, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)})
time.sleep(0.3)
expect_error("file: WORLD_SIZE 2 on rank 0, 3 on rank 1: rank 1 stops naming both", start(f"file:{d}", 1, 3), "world size: rank 0's 2, rank 1's 3", 5)
expect_error("... and rank 0 stops at its timeout naming both", r0, "world size: rank 0's 2, rank 1's 3", TIMEOUT + SLACK_S)
d = folder()
expect_error("file: rank 1 alone: stops at its timeout, waiting for rank 0", start(f"file:{d}", 1, 2, env={"LLMC_DIST_TIMEOUT": str(TIMEOUT)}),
             f"rank 1 waited {TIMEOUT} s for rank 0", TIMEOUT + SLACK_S)
s.check("... and removes its HELLO", files(d) == [], str(files(d)))

s.finish()
