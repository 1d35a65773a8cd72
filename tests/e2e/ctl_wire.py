"""tests/e2e/ctl_wire.py: the control protocol's handshake and sealed frames (docs/protocol.md, "Authentication") for
the Python tests' own peers: a connector (a probe that speaks as a router or a worker) and a listener (a fake worker).
The one Python copy of it: e2e_util, tmo_util, fake_worker and the attack tests use this file."""
import ctypes
import ctypes.util
import hashlib
import hmac
import json
import os
import struct
import threading
import time

PROTO = 3  # PRT_VERSION (proto/proto.h)
C2L, L2C = b"ctlC", b"ctlL"  # the seals' direction labels (ctl/hub.h)


def proof(secret, nonce_l, nonce_c, name, member, addr):
    """The hello's `auth`: hex HMAC-SHA256 under the secret over its fields, NUL-separated (ctl_auth_proof)."""
    msg = b"\0".join(x.encode() for x in ("dserve ctl hello v2", nonce_l, nonce_c, name, member, addr))
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def proof_back(secret, nonce):
    """The listener's proof back in hello_ok: hex HMAC-SHA256(secret, "listener:" + nonce)."""
    return hmac.new(secret.encode(), ("listener:" + nonce).encode(), hashlib.sha256).hexdigest()


def hkdf_sha256(ikm, salt, info, n):
    """RFC 5869."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, t, i = b"", b"", 1
    while len(out) < n:
        t = hmac.new(prk, t + info + bytes([i]), hashlib.sha256).digest()
        out += t
        i += 1
    return out[:n]


def session_keys(secret, nonce_l, nonce_c, proof_hex):
    """(c2l, l2c): HKDF-SHA256 over the secret, salted with both nonces, bound to the proof (ctl_session_keys)."""
    k = hkdf_sha256(secret.encode(), nonce_l.encode() + b"\0" + nonce_c.encode(),
                    b"dserve ctl keys v2\0" + proof_hex.encode(), 64)
    return k[:32], k[32:]


class InvalidTag(Exception):
    """A sealed frame that failed to open."""


_crypto = None


def _lib():
    """libcrypto (the one dserve links), for AES-256-GCM: the standard library has no AEAD."""
    global _crypto
    if _crypto is None:
        lib = ctypes.CDLL(ctypes.util.find_library("crypto") or "libcrypto.so.3")
        for f in ("EVP_CIPHER_CTX_new", "EVP_aes_256_gcm"):
            getattr(lib, f).restype = ctypes.c_void_p
        for f in ("EVP_CIPHER_CTX_free",):
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        P, I, IP = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)
        lib.EVP_CipherInit_ex.argtypes = [P, P, P, ctypes.c_char_p, ctypes.c_char_p, I]
        lib.EVP_CIPHER_CTX_ctrl.argtypes = [P, I, I, P]
        lib.EVP_CipherUpdate.argtypes = [P, P, IP, ctypes.c_char_p, I]
        lib.EVP_CipherFinal_ex.argtypes = [P, P, IP]
        _crypto = lib
    return _crypto


def aes_gcm(key, nonce, data, aad, encrypt):
    """AES-256-GCM: encrypt gives ciphertext + 16-byte tag; decrypt takes that and gives the text or InvalidTag."""
    lib = _lib()
    ctx = lib.EVP_CIPHER_CTX_new()
    try:
        if not encrypt:
            data, tag = data[:-16], data[-16:]
        enc = 1 if encrypt else 0
        n = ctypes.c_int(0)
        out = ctypes.create_string_buffer(len(data) + 16)
        ok = lib.EVP_CipherInit_ex(ctx, lib.EVP_aes_256_gcm(), None, None, None, enc) and \
            lib.EVP_CIPHER_CTX_ctrl(ctx, 0x9, 12, None) and \
            lib.EVP_CipherInit_ex(ctx, None, None, key, nonce, enc) and \
            lib.EVP_CipherUpdate(ctx, None, ctypes.byref(n), aad, len(aad)) and \
            lib.EVP_CipherUpdate(ctx, out, ctypes.byref(n), data, len(data))
        if not ok:
            raise InvalidTag("libcrypto failed")
        text = out.raw[:len(data)]
        if encrypt:
            tail = ctypes.create_string_buffer(16)
            tagbuf = ctypes.create_string_buffer(16)
            if not (lib.EVP_CipherFinal_ex(ctx, tail, ctypes.byref(n)) and
                    lib.EVP_CIPHER_CTX_ctrl(ctx, 0x10, 16, tagbuf)):  # EVP_CTRL_GCM_GET_TAG
                raise InvalidTag("libcrypto failed")
            return text + tagbuf.raw
        tagbuf = ctypes.create_string_buffer(tag, 16)
        tail = ctypes.create_string_buffer(16)
        if not (lib.EVP_CIPHER_CTX_ctrl(ctx, 0x11, 16, tagbuf) and  # EVP_CTRL_GCM_SET_TAG
                lib.EVP_CipherFinal_ex(ctx, tail, ctypes.byref(n)) > 0):
            raise InvalidTag("a sealed control frame failed to open")
        return text
    finally:
        lib.EVP_CIPHER_CTX_free(ctx)


class Seal:
    """One direction: AES-256-GCM, nonce = 4-byte label + 64-bit big-endian sequence number."""

    def __init__(self, key, label):
        self.key, self.label, self.seq = key, label, 0

    def _nonce(self):
        n = self.label + struct.pack(">Q", self.seq)
        self.seq += 1
        return n

    def seal(self, data, aad):
        return aes_gcm(self.key, self._nonce(), data, aad, True)

    def open(self, data, aad):
        return aes_gcm(self.key, self._nonce(), data, aad, False)  # raises InvalidTag


def addr_of(pair):
    return "%s:%d" % (pair[0], pair[1])


class Conn:
    """One framed control connection (either side): 4-byte big-endian length + one JSON object, sealed once
    seal() was called."""

    def __init__(self, sock):
        self.s = sock
        self.buf = b""
        self.tx = self.rx = None
        self.lock = threading.Lock()
        self.pending = []  # token messages of a token_batch recv_op has read and not yet returned
        self.hello = None

    def seal(self, tx_key, tx_label, rx_key, rx_label):
        self.tx, self.rx = Seal(tx_key, tx_label), Seal(rx_key, rx_label)

    def send(self, obj):
        data = json.dumps(obj).encode()
        with self.lock:
            hdr = struct.pack(">I", len(data) + (16 if self.tx else 0))
            if self.tx:
                data = self.tx.seal(data, hdr)
            self.s.sendall(hdr + data)

    def _read(self, n, deadline):
        while len(self.buf) < n:
            if deadline is not None:
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError("no control message")
                self.s.settimeout(left)
            else:
                self.s.settimeout(None)
            b = self.s.recv(65536)
            if not b:
                raise ConnectionError("the peer closed the control connection")
            self.buf += b
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self, timeout=10.0):
        """The next message; TimeoutError, ConnectionError, or InvalidTag for a frame that fails to open."""
        deadline = None if timeout is None else time.time() + timeout
        hdr = self._read(4, deadline)
        (n,) = struct.unpack(">I", hdr)
        data = self._read(n, deadline)
        if self.rx:
            data = self.rx.open(data, hdr)
        return json.loads(data)

    def recv_op(self, ops, timeout):
        """The next message whose op is in ops (others are dropped), or TimeoutError. A token_batch (protocol version
        3: one step's tokens) is read as its token messages, one by one, when ops asks for "token" and not for it."""
        deadline = time.time() + timeout
        while True:
            m = self.pending.pop(0) if self.pending else self.recv(max(0.001, deadline - time.time()))
            if m.get("op") == "token_batch" and "token" in ops and "token_batch" not in ops:
                self.pending += [dict(item, op="token") for item in m.get("items", [])]
                continue
            if m.get("op") in ops:
                return m

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def connect(sock, secret, member=None, role="router", name="probe", timeout=10.0, extra=None):
    """The connector's side on a connected socket: proves the secret for member (None: the name the listener's
    challenge gives, as a test probe that dials by port does), seals, reads hello_ok (in .hello). Returns the Conn;
    AssertionError when the listener answered something else (an `error` is in the message)."""
    c = Conn(sock)
    try:
        ch = c.recv(timeout)
        if ch.get("op") != "challenge":
            raise AssertionError("expected challenge, got %r" % ch)
        member = member or ch.get("name", "")
        nonce = os.urandom(16).hex()
        addr = addr_of(sock.getpeername())
        auth = proof(secret, ch["nonce"], nonce, name, member, addr)
        hello = {"op": "hello", "role": role, "name": name, "proto": PROTO, "auth": auth, "nonce": nonce,
                 "member": member, "addr": addr}
        hello.update(extra or {})
        c.send(hello)
        c2l, l2c = session_keys(secret, ch["nonce"], nonce, auth)
        c.seal(c2l, C2L, l2c, L2C)
        ok = c.recv(timeout)
        if ok.get("op") != "hello_ok":
            raise AssertionError("expected hello_ok, got %r" % ok)
        if ok.get("auth") != proof_back(secret, nonce):
            raise AssertionError("hello_ok without the listener's proof back")
    except BaseException:
        c.close()
        raise
    c.hello = ok
    return c


def accept(sock, secret, name, hello_ok, timeout=10.0):
    """The listener's side on an accepted socket, as a real hub: challenge, a hello whose proof is right for this
    member (name; None: whichever member the connector dialled, as a fake that stands for any worker) at this address,
    then sealed frames. hello_ok: the fields to answer with (op, name and auth are added), or a function of the
    hello that returns them. Returns (Conn, hello), or (None, reason) refused."""
    c = Conn(sock)
    nonce = os.urandom(16).hex()
    c.send({"op": "challenge", "nonce": nonce, "name": name or "fake"})
    try:
        h = c.recv(timeout)
    except (TimeoutError, ConnectionError, ValueError, OSError) as e:
        c.close()
        return None, "no hello (%s)" % e
    fields = [h.get(k) for k in ("auth", "nonce", "name", "member", "addr")]
    if h.get("op") != "hello" or not all(isinstance(f, str) for f in fields):
        c.close()
        return None, "not a hello with a proof"
    here = addr_of(sock.getsockname())
    want = proof(secret, nonce, h["nonce"], h["name"], h["member"], h["addr"])
    if not hmac.compare_digest(h["auth"], want):
        c.close()
        return None, "wrong proof"
    c2l, l2c = session_keys(secret, nonce, h["nonce"], h["auth"])
    c.seal(l2c, L2C, c2l, C2L)
    name = name or h["member"]
    if h["member"] != name or h["addr"] != here:
        c.send({"op": "error", "code": "wrong_member",
                "message": "it dialled member '%s' at %s, but this is '%s' at %s" % (h["member"], h["addr"], name, here)})
        c.close()
        return None, "wrong member"
    ok = dict(hello_ok(h) if callable(hello_ok) else hello_ok)
    ok.update({"op": "hello_ok", "name": name, "auth": proof_back(secret, h["nonce"])})
    c.send(ok)
    return c, h
