//go:build linux && cgo

/*
 * zygote mode: a fork server for exec requests.
 *
 * StartZygote (zygote_linux.go) starts the binary with _DSEC_NSEXEC=zygote
 * and one end of a SOCK_SEQPACKET socketpair on fd 3. The constructor in
 * nsexec_linux.c calls dsec_run_zygote, so the Go runtime never starts: the
 * zygote is one thread with a small address space, cheap to fork.
 *
 * It takes one request at a time (the framing is in nsexec_linux.h: a first
 * message with the config's length, its first bytes and four descriptors,
 * then continuations for a config larger than a chunk). For each request
 * it forks a worker and goes back to the socket at once; the worker puts
 * the request's stdio on fds 0-2 and its status descriptor on fd 3, then
 * does exactly what the exec helper does (dsec_exec_request): join the
 * cgroups and namespaces, fork the command, report "ok <pid>" or "err ..."
 * on the status descriptor, exit. The command is then orphaned and goes to
 * the nearest child subreaper, the keeper.
 *
 * Invariants:
 *   - The zygote holds fds 0-2, the socket (3) and, between receiving a
 *     request and forking its worker, that request's descriptors; nothing
 *     else. Every descriptor it receives is close-on-exec and closed in the
 *     zygote once the worker is forked.
 *   - It allocates nothing per request: configs land in one buffer mapped
 *     at start, whose pages beyond the first chunk are given back after a
 *     large request.
 *   - It sends one message, DSEC_ZYGOTE_MAGIC_READY once set up, and
 *     nothing else.
 *   - SIGCHLD is ignored, so the kernel reaps workers as they exit: no
 *     zombie stays. Every other signal it can ignore is ignored too; it
 *     ends on EOF (or ECONNRESET) of the socket, when its parent dies
 *     (PR_SET_PDEATHSIG), or by SIGKILL.
 *   - A malformed request is answered with "err ..." on its status
 *     descriptor (the first descriptor it carried, if any) and dropped; the
 *     zygote goes on serving.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "nsexec_linux.h"

#define SOCK_FD DSEC_ZYGOTE_SOCK_FD
#define HEADER DSEC_ZYGOTE_HEADER
#define CHUNK DSEC_ZYGOTE_CHUNK
#define NFDS DSEC_ZYGOTE_NFDS

/* Where requests land: DSEC_MAX_CONFIG bytes, mapped once at start. */
static uint8_t *request_buf;

static void zygote_fatal(const char *what) __attribute__((noreturn));
static void zygote_fatal(const char *what)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_str(&m, "dsec-zygote: ");
	dsec_msg_str(&m, what);
	dsec_msg_str(&m, ": errno ");
	dsec_msg_uint(&m, (unsigned long long)errno);
	dsec_msg_str(&m, "\n");
	(void)dsec_write_all(2, m.b, m.n); /* nothing more to do if stderr is gone */
	_exit(1);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One received message. */
struct message {
	size_t len; /* bytes received, header included */
	uint32_t magic; /* the header's words; 0 when len < HEADER */
	uint32_t arg;
	int flags; /* msg_flags: MSG_TRUNC, MSG_CTRUNC */
	int foreign; /* a control message other than SCM_RIGHTS came */
	int fds[NFDS]; /* received descriptors, close-on-exec */
	int nfds;
};

static void close_fds(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		(void)close(fds[i]); /* on Linux the fd is gone even on EINTR */
}

/*
 * reject answers a request that cannot be served on its status descriptor,
 * the first of fds, and closes all of them. Without a descriptor there is
 * nobody to tell. A status descriptor that cannot be written to (the keeper
 * gave up) changes nothing.
 */
static void reject(const int *fds, int nfds, int err, const char *step, const char *detail)
{
	if (nfds > 0)
		(void)dsec_report(fds[0], err, step, detail);
	close_fds(fds, nfds);
}

/*
 * peer_closed reports whether the keeper has closed its end. Only needed
 * to tell EOF from an empty message: recvmsg returns 0 for both.
 */
static int peer_closed(void)
{
	struct pollfd p = { .fd = SOCK_FD, .events = POLLRDHUP };

	while (poll(&p, 1, 0) < 0)
		if (errno != EINTR)
			zygote_fatal("poll");
	return (p.revents & (POLLRDHUP | POLLHUP)) != 0;
}

/*
 * receive reads one message: its header, up to cap payload bytes into buf
 * and up to NFDS descriptors. It returns 1, or 0 when the keeper has closed
 * its end (then the zygote's work is over).
 */
static int receive(struct message *m, uint8_t *buf, size_t cap)
{
	uint8_t hdr[HEADER];
	struct iovec iov[2] = { { hdr, sizeof(hdr) }, { buf, cap } };
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int) * NFDS)];
	} ctl;
	struct msghdr mh;
	struct cmsghdr *cm;
	ssize_t n;

	memset(m, 0, sizeof(*m));
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = iov;
	mh.msg_iovlen = 2;
	mh.msg_control = ctl.b;
	mh.msg_controllen = sizeof(ctl.b);
	do
		n = recvmsg(SOCK_FD, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == ECONNRESET)
			return 0;
		zygote_fatal("recvmsg");
	}

	for (cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
			m->foreign = 1;
			continue;
		}
		size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < count && m->nfds < NFDS; i++)
			memcpy(&m->fds[m->nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if (n == 0 && m->nfds == 0 && !m->foreign && peer_closed())
		return 0;

	m->len = (size_t)n;
	m->flags = mh.msg_flags;
	if (m->len >= HEADER) {
		m->magic = get32(hdr);
		m->arg = get32(hdr + 4);
	}
	return 1;
}

/*
 * worker_main is the worker: the request's stdin, stdout and stderr become
 * fds 0-2, its status descriptor fd 3 (close-on-exec, replacing the socket),
 * and nothing else stays open. Then it is the exec helper.
 */
static void worker_main(const int *fds, size_t len) __attribute__((noreturn));
static void worker_main(const int *fds, size_t len)
{
	struct sigaction sa;

	/*
	 * The zygote ignores SIGCHLD to have its workers reaped for it; a
	 * worker waits for a command that failed to start, so it needs the
	 * default back. Every other ignored signal is reset in the command.
	 */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) {
		(void)dsec_report(fds[0], errno, "worker", "reset SIGCHLD");
		_exit(1);
	}
	/* Received descriptors are above 3 (0-3 are open), so no overlap. */
	if (dup2(fds[1], 0) < 0 || dup2(fds[2], 1) < 0 || dup2(fds[3], 2) < 0) {
		(void)dsec_report(fds[0], errno, "worker", "set up stdio");
		_exit(1);
	}
	if (dup3(fds[0], SOCK_FD, O_CLOEXEC) < 0) {
		(void)dsec_report(fds[0], errno, "worker", "move status fd");
		_exit(1);
	}
	dsec_close_from(SOCK_FD + 1);
	dsec_exec_request(request_buf, len, SOCK_FD);
}

/*
 * serve handles the request that begins with first: it reads the rest of
 * the config, forks the worker and closes the request's descriptors.
 */
static void serve(struct message *first)
{
	size_t total, off;
	pid_t pid;

	if (first->flags & MSG_CTRUNC) {
		reject(first->fds, first->nfds, EINVAL, "zygote request", "more than 4 descriptors");
		return;
	}
	if (first->foreign) {
		reject(first->fds, first->nfds, EINVAL, "zygote request", "unexpected control message");
		return;
	}
	if (first->flags & MSG_TRUNC) {
		reject(first->fds, first->nfds, EMSGSIZE, "zygote request", "message longer than a chunk");
		return;
	}
	if (first->magic != DSEC_ZYGOTE_MAGIC_FIRST) {
		/* Also the continuations of a request already rejected. */
		reject(first->fds, first->nfds, EINVAL, "zygote request", "bad header");
		return;
	}
	if (first->nfds != NFDS) {
		reject(first->fds, first->nfds, EINVAL, "zygote request", "want 4 descriptors");
		return;
	}
	total = first->arg;
	if (total > DSEC_MAX_CONFIG) {
		reject(first->fds, first->nfds, EFBIG, "zygote request", "config larger than 1 MiB");
		return;
	}
	off = first->len - HEADER;
	if (off > total) {
		reject(first->fds, first->nfds, EINVAL, "zygote request", "more bytes than announced");
		return;
	}

	while (off < total) {
		struct message next;
		size_t cap = total - off < CHUNK ? total - off : CHUNK;

		if (!receive(&next, request_buf + off, cap)) {
			close_fds(first->fds, first->nfds);
			_exit(0);
		}
		if (next.nfds > 0 || next.foreign || (next.flags & (MSG_TRUNC | MSG_CTRUNC)) ||
		    next.magic != DSEC_ZYGOTE_MAGIC_NEXT || next.arg != off || next.len <= HEADER) {
			/* A new request (or garbage) where the rest of this one belongs. */
			reject(next.fds, next.nfds, EINVAL, "zygote request", "a request came before the previous one ended");
			reject(first->fds, first->nfds, EINVAL, "zygote request", "config ended early");
			return;
		}
		off += next.len - HEADER;
	}

	pid = fork();
	if (pid == 0)
		worker_main(first->fds, total);
	if (pid < 0) {
		reject(first->fds, first->nfds, errno, "fork worker", "");
		return;
	}
	close_fds(first->fds, first->nfds);
	/* Give back what a large config touched beyond the first chunk. */
	if (total > CHUNK && madvise(request_buf + CHUNK, DSEC_MAX_CONFIG - CHUNK, MADV_DONTNEED) < 0)
		zygote_fatal("madvise");
}

/* setup makes the process a zygote: descriptors, signals, attributes. */
static void setup(void)
{
	struct sigaction sa;
	sigset_t none;
	int type;
	socklen_t len = sizeof(type);

	if (getsockopt(SOCK_FD, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET) {
		static const char text[] = "dsec: _DSEC_NSEXEC=zygote needs a SOCK_SEQPACKET socket on fd 3 (started by nsexec.StartZygote)\n";
		(void)dsec_write_all(2, text, sizeof(text) - 1);
		_exit(1);
	}
	/* Die with the keeper, even if a request keeps us busy. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		zygote_fatal("set parent death signal");
	/* Keep other processes from ptracing us or reading our fds. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		zygote_fatal("set not dumpable");
	/* The name only helps people reading ps; failing to set it is harmless. */
	(void)prctl(PR_SET_NAME, "dsec-zygote", 0, 0, 0);

	/*
	 * Received descriptors must land above 3, where a worker can move
	 * them into place: fill 0-2 if we were started without them.
	 */
	for (int fd = 0; fd < 3; fd++) {
		if (fcntl(fd, F_GETFD) >= 0)
			continue;
		if (errno != EBADF || open("/dev/null", O_RDWR) != fd)
			zygote_fatal("open /dev/null");
	}
	if (fcntl(SOCK_FD, F_SETFD, FD_CLOEXEC) < 0)
		zygote_fatal("set close-on-exec on the socket");
	dsec_close_from(SOCK_FD + 1);
	/* Do not pin the keeper's working directory's mount. */
	if (chdir("/") < 0)
		zygote_fatal("chdir /");

	/*
	 * Ignore every signal we may (EINVAL for SIGKILL, SIGSTOP and those
	 * libc keeps). SIGCHLD ignored means the kernel reaps our workers.
	 */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	for (int sig = 1; sig < NSIG; sig++)
		if (sigaction(sig, &sa, NULL) < 0 && errno != EINVAL)
			zygote_fatal("ignore signal");
	if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		zygote_fatal("set signal mask");

	request_buf = mmap(NULL, DSEC_MAX_CONFIG, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (request_buf == MAP_FAILED)
		zygote_fatal("map the request buffer");
}

void dsec_run_zygote(void)
{
	const uint8_t ready[4] = {
		DSEC_ZYGOTE_MAGIC_READY & 0xff, DSEC_ZYGOTE_MAGIC_READY >> 8 & 0xff,
		DSEC_ZYGOTE_MAGIC_READY >> 16 & 0xff, DSEC_ZYGOTE_MAGIC_READY >> 24,
	};

	setup();
	/* Tell StartZygote that we are set up (and are a zygote at all). */
	while (send(SOCK_FD, ready, sizeof(ready), MSG_NOSIGNAL) < 0)
		if (errno != EINTR)
			_exit(errno == EPIPE || errno == ECONNRESET ? 0 : 1);
	for (;;) {
		struct message first;

		if (!receive(&first, request_buf, CHUNK))
			_exit(0);
		serve(&first);
	}
}
