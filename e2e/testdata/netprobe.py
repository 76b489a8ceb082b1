# netprobe.py: bypass attempts from inside a sandbox (issue 14). Run as
# python3 netprobe.py JSON, where JSON names the targets; prints one JSON
# object: for each check, what happened. Every attempt is bounded in time.
import json, random, socket, ssl, struct, sys, time

T = json.loads(sys.argv[1])
out = {}


def attempt(name, fn):
    t0 = time.monotonic()
    try:
        res = fn()
        out[name] = {"ok": True, "result": res, "s": round(time.monotonic() - t0, 3)}
    except Exception as e:  # the point is what fails
        out[name] = {"ok": False, "error": type(e).__name__ + ": " + str(e), "s": round(time.monotonic() - t0, 3)}


def tcp(host, port, send=b"", family=socket.AF_INET, timeout=3):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        if send:
            s.sendall(send)
        data = s.recv(200)
        if not data:
            raise ConnectionResetError("closed without a byte")
        return data.decode("latin-1")
    finally:
        s.close()


def http(host, port, hostheader):
    return tcp(host, port, ("GET /simple/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % hostheader).encode())


def tls(host, port, sni):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = socket.create_connection((host, port), timeout=3)
    try:
        w = ctx.wrap_socket(s, server_hostname=sni)
        w.sendall(b"GET / HTTP/1.1\r\nHost: " + sni.encode() + b"\r\n\r\n")
        return w.recv(200).decode("latin-1")
    finally:
        s.close()


def dns(server, name):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, (server, 53))
        data, _ = s.recvfrom(4096)
    finally:
        s.close()
    rcode, an = data[3] & 15, struct.unpack(">H", data[6:8])[0]
    i = 12
    while data[i] != 0:
        i += data[i] + 1
    i += 5
    ips = []
    for _ in range(an):
        if data[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while data[i] != 0:
                i += data[i] + 1
            i += 1
        typ, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[i:i + 10])
        i += 10
        if typ == 1:
            ips.append(socket.inet_ntoa(data[i:i + 4]))
        i += rdlen
    return {"rcode": rcode, "ips": ips}


def scan(host, ports):
    opened = []
    for p in ports:
        try:
            tcp(host, p, b"x", timeout=0.5)
            opened.append(p)
        except Exception:
            pass
    return opened


def icmp(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(1)
    try:
        body = struct.pack(">BBHHH", 8, 0, 0, 1, 1) + b"dsec"
        csum = 0
        for j in range(0, len(body), 2):
            csum += (body[j] << 8) + body[j + 1]
        csum = (csum >> 16) + (csum & 0xFFFF)
        csum = ~csum & 0xFFFF
        body = body[:2] + struct.pack(">H", csum) + body[4:]
        s.sendto(body, (host, 0))
        while True:
            data, addr = s.recvfrom(200)
            if data[20] == 0:  # an echo reply
                return addr[0]
    finally:
        s.close()


def packet():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    try:
        s.bind(("eth0", 0))
        # A broadcast frame with an IPv4 UDP datagram to the echo host:
        # nothing may come back.
        s.send(b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + b"\x45" + b"\x00" * 27)
        s.settimeout(1)
        while True:
            data = s.recv(2000)
            if T["echo_host"].encode() in data or b"dsec-echo" in data:
                return "a reply"
    finally:
        s.close()


pypi, pport = T["pypi_host"], T["pypi_port"]
# The scans first: their many denials must not push the others out of the
# sandbox's log of recent denials (64 kept).
attempt("node_addrs", lambda: {a: scan(a, [T["api_port"], 22, 80, 7422]) for a in T["node_addrs"]})
attempt("scan_router", lambda: scan(T["router"], list(range(1, 120)) + [T["api_port"], 7422, 8080]))
attempt("pypi_name", lambda: socket.gethostbyname("pypi.org"))
attempt("pypi_http", lambda: http("pypi.org", pport, "pypi.org:%d" % pport))
attempt("npm_name", lambda: socket.gethostbyname("registry.npmjs.org"))
attempt("npm_addr", lambda: tls(T["npm_host"], T["npm_port"], "registry.npmjs.org"))
attempt("echo", lambda: tcp(T["echo_host"], T["echo_port"], b"dsec-echo\n"))
attempt("pypi_other_port", lambda: tcp(pypi, T["echo_port"], b"dsec-echo\n"))
attempt("pypi_addr_denied_host", lambda: http(pypi, pport, "registry.npmjs.org"))
attempt("pypi_addr_denied_sni", lambda: tls(pypi, pport, "registry.npmjs.org"))
attempt("pypi_allowed_sni_other_addr", lambda: tls(T["npm_host"], T["npm_port"], "pypi.org"))
attempt("own_resolver_allowed", lambda: dns(T["dns_host"], "pypi.org"))
attempt("own_resolver_denied", lambda: dns(T["dns_host"], "registry.npmjs.org"))
attempt("own_resolver_public", lambda: dns("8.8.8.8", "leak.example.com"))
attempt("ipv6", lambda: tcp("2001:db8::1", 80, b"x", family=socket.AF_INET6))
attempt("ipv6_loopback_host", lambda: tcp("::ffff:127.0.0.1", T["api_port"], b"x", family=socket.AF_INET6))
attempt("host_api", lambda: tcp("127.0.0.1", T["api_port"], b"GET /healthz HTTP/1.0\r\n\r\n"))
attempt("other_sandbox", lambda: tcp(T["other_sandbox"], 9000, b"x"))
attempt("metadata", lambda: http("169.254.169.254", 80, "169.254.169.254"))
attempt("icmp_router", lambda: icmp(T["router"]))
attempt("icmp_echo_host", lambda: icmp(T["echo_host"]))
attempt("packet_socket", packet)
print(json.dumps(out))
