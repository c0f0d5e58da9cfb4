"""The stand-in of CuPy's ``cupyx.distributed._store``: the same interface (``TCPStore(world_size)``
with ``run(host, port)`` and ``stop()``; ``TCPStoreProxy(host, port)`` with ``proxy[key]``,
``proxy[key] = value`` (an int or bytes of at most about 240 bytes, as CuPy's 256-byte
messages allow) and ``barrier()``), written for the tests: one request per connection, the
server a thread of process 0 (CuPy's is a child process), each request a pickled tuple."""
import pickle
import socket
import threading
import time

_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 13333
_MESSAGE = 256


def _recv_all(sock):
    chunks = []
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class TCPStore:
    def __init__(self, world_size):
        self.storage = {}
        self._world_size = world_size
        self._barrier = threading.Barrier(world_size)
        self._socket = None
        self._running = False

    def _serve_one(self, conn):
        with conn:
            request = pickle.loads(_recv_all(conn))
            action, key, value = request
            try:
                if action == "set":
                    if type(value) not in (bytes, bytearray, int):
                        raise ValueError("Invalid type for value, only int or bytes allowed")
                    if len(key) + (len(value) if not isinstance(value, int) else 8) + 2 > _MESSAGE:
                        raise ValueError("Invalid length for message")
                    self.storage[key] = value
                    reply = (0, True)
                elif action == "get":
                    reply = (0, self.storage[key])
                else:
                    self._barrier.wait()
                    reply = (0, True)
            except Exception as err:  # noqa: BLE001 - sent back to the client, as CuPy's store does
                reply = (1, str(err))
            conn.sendall(pickle.dumps(reply))

    def _loop(self):
        while self._running:
            try:
                conn, _ = self._socket.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def run(self, host=_DEFAULT_HOST, port=_DEFAULT_PORT):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self._socket.listen()
        self._socket.settimeout(0.2)
        self._running = True
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self):
        self._running = False
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class TCPStoreProxy:
    MAX_NUM_RETRIES = 50
    DELAY_FOR_RETRY = 0.5

    def __init__(self, host=_DEFAULT_HOST, port=_DEFAULT_PORT):
        self.host, self.port = host, port

    def _send_recv(self, request):
        for _ in range(self.MAX_NUM_RETRIES):
            try:
                with socket.create_connection((self.host, self.port)) as s:
                    s.sendall(pickle.dumps(request))
                    s.shutdown(socket.SHUT_WR)
                    status, value = pickle.loads(_recv_all(s))
                if status:
                    raise RuntimeError(value)
                return value
            except ConnectionRefusedError:
                time.sleep(self.DELAY_FOR_RETRY)
        raise RuntimeError("TCPStore is not available")

    def __getitem__(self, key):
        return self._send_recv(("get", key, None))

    def __setitem__(self, key, value):
        self._send_recv(("set", key, value))

    def barrier(self):
        self._send_recv(("barrier", None, None))
