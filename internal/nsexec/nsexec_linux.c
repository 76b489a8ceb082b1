//go:build linux && cgo

/*
 * The part of dsec that runs before the Go runtime starts.
 *
 * dsec_nsexec() is a constructor: it runs in every process of a binary that
 * imports internal/nsexec, before main and before the Go runtime creates
 * its threads. When _DSEC_NSEXEC is unset or empty it returns at once. When
 * it names a mode it does that mode's work and never returns: the process
 * stays single-threaded, which setns(2) of a user or mount namespace needs.
 *
 *   init    the sandbox's pid 1: reap zombies, ignore every signal.
 *   exec    the helper that Spawn (nsexec_linux.go) starts: read a config
 *           from fd 3, join the target's cgroups and namespaces, fork the
 *           command, report "ok <pid>\n" or "err <errno> <step>: <detail>\n"
 *           on fd 4.
 *   zygote  a fork server that StartZygote (zygote_linux.go) starts: it
 *           takes requests on a socket and forks, for each, a worker that
 *           does what the exec helper does. It lives in zygote_linux.c.
 *   userns  makes a sandbox's user namespace as the uid it runs under (the
 *           sandbox's own host root), sets its limits, and holds it while
 *           the runtime joins it (userns_linux.go).
 *   pause   blocks every signal and waits; a process that only holds its
 *           namespaces open (rootfs.NewUserns).
 *
 * Rules of these files: no library beyond libc, no stdio, every system
 * call's result checked, EINTR retried where a call can return it. Every
 * process is single-threaded throughout, so using malloc after fork is safe.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/seccomp.h>

#include "nsexec_linux.h"

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define MODE_ENV "_DSEC_NSEXEC"

/* Descriptors of the exec mode, set up by Spawn. */
#define CONFIG_FD 3
#define STATUS_FD 4

/* The init's seccomp filter (init mode), passed by the OCI runtime. */
#define INIT_FILTER_FD 4

/* The user namespace helper's socket to the keeper (userns mode). */
#define USERNS_FD 3

/*
 * Where the helper (P) reports: STATUS_FD in exec mode, the request's status
 * descriptor in a zygote's worker. Set before anything can fail.
 */
static int status_fd = -1;

/* Limits; keep in sync with config.go. */
#define MAX_CONFIG DSEC_MAX_CONFIG
#define MAX_GROUPS 65536
#define MAX_SECCOMP_INSNS 4096

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* Record tags; keep in sync with config.go. */
enum {
	TAG_PID = 1,
	TAG_CGROUP_PROCS = 2,
	TAG_UID = 3,
	TAG_GID = 4,
	TAG_GROUPS = 5,
	TAG_CWD = 6,
	TAG_ARG = 7,
	TAG_ENV = 8,
	TAG_KEEP_CAPS = 9,
	TAG_NO_NEW_PRIVS = 10,
	TAG_SECCOMP = 11,
	TAG_SETSID = 12,
	TAG_TTY = 13,
	TAG_MNT_NS = 14,
	TAG_MAX = 14,
};

struct config {
	uint32_t pid;
	char **cgroup_procs; /* n_cgroup_procs entries */
	size_t n_cgroup_procs;
	uid_t uid;
	gid_t gid;
	gid_t *groups; /* n_groups entries */
	size_t n_groups;
	char *cwd; /* NULL: stay at the root */
	char **argv; /* NULL-terminated, argc >= 1 */
	size_t argc;
	char **envp; /* NULL-terminated */
	size_t envc;
	uint64_t keep_caps;
	int no_new_privs;
	struct sock_filter *filter; /* NULL: no seccomp filter */
	unsigned short filter_len;
	int setsid;
	int tty;
	char *mnt_ns; /* NULL: the target's mount namespace */
};

/* ---------------------------------------------------------------------
 * Small helpers: messages without stdio, I/O that retries.
 */

void dsec_msg_str(struct dsec_msg *m, const char *s)
{
	while (*s && m->n < sizeof(m->b))
		m->b[m->n++] = *s++;
}

void dsec_msg_uint(struct dsec_msg *m, unsigned long long v)
{
	char d[24];
	int i = 0;

	do {
		d[i++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (i > 0 && m->n < sizeof(m->b))
		m->b[m->n++] = d[--i];
}

int dsec_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * read_full reads until EOF or until cap bytes are read. Returns the count,
 * or -1 with errno set.
 */
static ssize_t read_full(int fd, void *buf, size_t cap)
{
	char *p = buf;
	size_t got = 0;

	while (got < cap) {
		ssize_t n = read(fd, p + got, cap - got);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

void dsec_close_from(unsigned int lowfd)
{
	long max;

	if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0)
		return;
	/* Kernels before 5.9 lack close_range: close one by one. */
	max = sysconf(_SC_OPEN_MAX);
	if (max < 0 || max > 1 << 20)
		max = 1 << 20;
	for (long fd = lowfd; fd < max; fd++)
		close((int)fd); /* EBADF for most: nothing to do */
}

/* ---------------------------------------------------------------------
 * init mode
 */

/* reap_all collects every zombie child without blocking. */
static void reap_all(void)
{
	for (;;) {
		pid_t pid = waitpid(-1, NULL, WNOHANG);
		if (pid > 0)
			continue;
		if (pid < 0 && errno == EINTR)
			continue;
		return; /* 0: children left, none dead; -1 ECHILD: none at all */
	}
}

static void init_fatal(const char *what)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_str(&m, "dsec-init: ");
	dsec_msg_str(&m, what);
	dsec_msg_str(&m, ": errno ");
	dsec_msg_uint(&m, (unsigned long long)errno);
	dsec_msg_str(&m, "\n");
	(void)dsec_write_all(2, m.b, m.n); /* nothing more to do if stderr is gone */
	_exit(1);
}

static void install_filter(struct sock_filter *filter, unsigned short len);

/*
 * init_filter reads the sandbox's seccomp filter from INIT_FILTER_FD (all of
 * it, at most MAX_SECCOMP_INSNS instructions) and installs it. The init
 * refuses to run without one: an unfiltered pid 1 is what an agent would
 * inject code into to escape the policy every other process has.
 */
static void init_filter(void)
{
	static struct sock_filter filter[MAX_SECCOMP_INSNS + 1];
	ssize_t n = read_full(INIT_FILTER_FD, filter, sizeof(filter));

	if (n < 0)
		init_fatal("read seccomp filter (fd 4)");
	if (n == 0 || n % (ssize_t)sizeof(struct sock_filter) != 0 ||
	    (size_t)n > MAX_SECCOMP_INSNS * sizeof(struct sock_filter)) {
		errno = EINVAL;
		init_fatal("seccomp filter on fd 4: want 1 to 4096 instructions");
	}
	/* Setting no_new_privs is always allowed; the runtime set it already. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		init_fatal("no_new_privs");
	install_filter(filter, (unsigned short)(n / (ssize_t)sizeof(struct sock_filter)));
}

/*
 * init_stdio makes fds 0-2 the sandbox's own /dev/null: whatever the
 * runtime passed (its own stdio) is the keeper's, never the sandbox's.
 */
static void init_stdio(void)
{
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);

	for (int i = 0; i <= 2; i++) {
		if (fd >= 0) {
			if (dup2(fd, i) < 0)
				init_fatal("dup2 /dev/null");
		} else if (close(i) < 0 && errno != EBADF && errno != EINTR) {
			init_fatal("close stdio");
		}
	}
	if (fd > 2 && close(fd) < 0 && errno != EINTR)
		init_fatal("close /dev/null");
}

static void run_init(void) __attribute__((noreturn));
static void run_init(void)
{
	sigset_t all;

	/*
	 * First: nothing in the sandbox may ptrace pid 1, open its /proc files
	 * (mem, fd/, root, environ) or read its memory.
	 */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		init_fatal("set not dumpable");
	init_filter();
	init_stdio();
	dsec_close_from(3);
	/* The name only helps people reading ps; failing to set it is harmless. */
	(void)prctl(PR_SET_NAME, "dsec-init", 0, 0, 0);

	if (sigfillset(&all) < 0)
		init_fatal("sigfillset");
	if (sigprocmask(SIG_BLOCK, &all, NULL) < 0)
		init_fatal("sigprocmask");

	/* Children may have died before the mask was set. */
	reap_all();
	for (;;) {
		siginfo_t si;
		int sig = sigwaitinfo(&all, &si);
		if (sig < 0) {
			if (errno == EINTR)
				continue;
			init_fatal("sigwaitinfo");
		}
		if (sig == SIGCHLD)
			reap_all();
		/* Every other signal is ignored: pid 1 only ends by SIGKILL. */
	}
}

/* ---------------------------------------------------------------------
 * exec mode: the helper (P) and the command's process (C)
 */

int dsec_report(int fd, int err, const char *step, const char *detail)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_str(&m, "err ");
	dsec_msg_uint(&m, (unsigned long long)err);
	dsec_msg_str(&m, " ");
	dsec_msg_str(&m, step);
	dsec_msg_str(&m, ": ");
	dsec_msg_str(&m, detail);
	if (m.n == sizeof(m.b))
		m.n--;
	m.b[m.n++] = '\n';
	return dsec_write_all(fd, m.b, m.n);
}

/*
 * status_fail reports a failure of P on the status descriptor and exits.
 * The line is "err <errno> <step>: <detail>\n".
 */
static void status_fail(int err, const char *step, const char *detail) __attribute__((noreturn));
static void status_fail(int err, const char *step, const char *detail)
{
	if (dsec_report(status_fd, err, step, detail) < 0)
		_exit(1);
	_exit(0);
}

/* status_fail_uint is status_fail with a number as the detail. */
static void status_fail_uint(int err, const char *step, unsigned long long v) __attribute__((noreturn));
static void status_fail_uint(int err, const char *step, unsigned long long v)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_uint(&m, v);
	m.b[m.n < sizeof(m.b) ? m.n : sizeof(m.b) - 1] = '\0';
	status_fail(err, step, m.b);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* config_str copies a string payload and NUL-terminates it. */
static char *config_str(const uint8_t *p, uint32_t len, uint16_t tag)
{
	char *s;

	if (memchr(p, '\0', len) != NULL)
		status_fail_uint(EINVAL, "config: NUL byte in record", tag);
	s = malloc((size_t)len + 1);
	if (s == NULL)
		status_fail(ENOMEM, "config", "out of memory");
	memcpy(s, p, len);
	s[len] = '\0';
	return s;
}

static void *config_alloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (p == NULL)
		status_fail(ENOMEM, "config", "out of memory");
	return p;
}

/*
 * parse_config decodes the records in buf into c. It makes two passes:
 * the first checks the framing and counts the repeatable records, the
 * second fills the arrays it sized. Every error ends the helper.
 */
static void parse_config(const uint8_t *buf, size_t len, struct config *c)
{
	size_t counts[TAG_MAX + 1] = { 0 };
	size_t off;
	size_t ncg = 0, narg = 0, nenv = 0;

	memset(c, 0, sizeof(*c));

	for (off = 0; off < len;) {
		uint16_t tag;
		uint32_t n;

		if (len - off < 6)
			status_fail(EINVAL, "config", "truncated record header");
		tag = get16(buf + off);
		n = get32(buf + off + 2);
		off += 6;
		if (n > len - off)
			status_fail_uint(EINVAL, "config: record longer than the config", tag);
		if (tag == 0 || tag > TAG_MAX)
			status_fail_uint(EINVAL, "config: unknown record tag", tag);
		counts[tag]++;
		if (counts[tag] > 1 && tag != TAG_CGROUP_PROCS && tag != TAG_ARG && tag != TAG_ENV)
			status_fail_uint(EINVAL, "config: repeated record", tag);
		off += n;
	}
	if (counts[TAG_PID] == 0)
		status_fail(EINVAL, "config", "no target pid");
	if (counts[TAG_ARG] == 0)
		status_fail(EINVAL, "config", "no command");

	c->cgroup_procs = config_alloc(counts[TAG_CGROUP_PROCS], sizeof(char *));
	c->argv = config_alloc(counts[TAG_ARG] + 1, sizeof(char *));
	c->envp = config_alloc(counts[TAG_ENV] + 1, sizeof(char *));

	for (off = 0; off < len;) {
		uint16_t tag = get16(buf + off);
		uint32_t n = get32(buf + off + 2);
		const uint8_t *p = buf + off + 6;

		off += 6 + (size_t)n;
		switch (tag) {
		case TAG_PID:
		case TAG_UID:
		case TAG_GID:
			if (n != 4)
				status_fail_uint(EINVAL, "config: bad length of record", tag);
			if (tag == TAG_PID)
				c->pid = get32(p);
			else if (tag == TAG_UID)
				c->uid = get32(p);
			else
				c->gid = get32(p);
			break;
		case TAG_CGROUP_PROCS:
			c->cgroup_procs[ncg++] = config_str(p, n, tag);
			break;
		case TAG_GROUPS:
			if (n == 0 || n % 4 != 0 || n / 4 > MAX_GROUPS)
				status_fail_uint(EINVAL, "config: bad length of record", tag);
			c->n_groups = n / 4;
			c->groups = config_alloc(c->n_groups, sizeof(gid_t));
			for (size_t i = 0; i < c->n_groups; i++)
				c->groups[i] = get32(p + 4 * i);
			break;
		case TAG_MNT_NS:
			if (n == 0 || p[0] != '/')
				status_fail(EINVAL, "config", "mount namespace file not absolute");
			c->mnt_ns = config_str(p, n, tag);
			break;
		case TAG_CWD:
			if (n == 0 || p[0] != '/')
				status_fail(EINVAL, "config", "working directory not absolute");
			c->cwd = config_str(p, n, tag);
			break;
		case TAG_ARG:
			c->argv[narg++] = config_str(p, n, tag);
			break;
		case TAG_ENV:
			c->envp[nenv++] = config_str(p, n, tag);
			break;
		case TAG_KEEP_CAPS:
			if (n != 8)
				status_fail_uint(EINVAL, "config: bad length of record", tag);
			c->keep_caps = get64(p);
			break;
		case TAG_NO_NEW_PRIVS:
		case TAG_SETSID:
		case TAG_TTY:
			if (n != 0)
				status_fail_uint(EINVAL, "config: bad length of record", tag);
			if (tag == TAG_NO_NEW_PRIVS)
				c->no_new_privs = 1;
			else if (tag == TAG_SETSID)
				c->setsid = 1;
			else
				c->tty = 1;
			break;
		case TAG_SECCOMP:
			if (n == 0 || n % sizeof(struct sock_filter) != 0 ||
			    n / sizeof(struct sock_filter) > MAX_SECCOMP_INSNS)
				status_fail_uint(EINVAL, "config: bad length of record", tag);
			/* Copied: the payload is not aligned for struct sock_filter. */
			c->filter = config_alloc(n / sizeof(struct sock_filter), sizeof(struct sock_filter));
			memcpy(c->filter, p, n);
			c->filter_len = (unsigned short)(n / sizeof(struct sock_filter));
			break;
		}
	}
	c->n_cgroup_procs = ncg;
	c->argc = narg;
	c->envc = nenv;
	c->argv[narg] = NULL;
	c->envp[nenv] = NULL;

	/* The same checks as ExecConfig.validate. */
	if (c->pid == 0 || c->pid > INT_MAX)
		status_fail_uint(EINVAL, "config: target pid out of range", c->pid);
	if (c->argv[0][0] == '\0')
		status_fail(EINVAL, "config", "empty program name");
	if (c->uid == (uid_t)-1 || c->gid == (gid_t)-1)
		status_fail(EINVAL, "config", "invalid user or group");
	for (size_t i = 0; i < c->n_groups; i++)
		if (c->groups[i] == (gid_t)-1)
			status_fail(EINVAL, "config", "invalid supplementary group");
	for (size_t i = 0; i < c->n_cgroup_procs; i++)
		if (c->cgroup_procs[i][0] != '/')
			status_fail(EINVAL, "config", "cgroup file not absolute");
	if (c->tty && !c->setsid)
		status_fail(EINVAL, "config", "tty without setsid");
}

/*
 * read_config reads all of fd 3, at most MAX_CONFIG bytes, into a buffer it
 * allocates, and returns the length.
 */
static size_t read_config(uint8_t **bufp)
{
	/* One byte more than allowed, to see a config that is too large. */
	uint8_t *buf = malloc(MAX_CONFIG + 1);
	ssize_t n;

	if (buf == NULL)
		status_fail(ENOMEM, "config", "out of memory");
	n = read_full(CONFIG_FD, buf, MAX_CONFIG + 1);
	if (n < 0)
		status_fail(errno, "config", "read");
	if (n > MAX_CONFIG)
		status_fail(EFBIG, "config", "larger than 1 MiB");
	if (close(CONFIG_FD) < 0 && errno != EINTR)
		status_fail(errno, "config", "close");
	*bufp = buf;
	return (size_t)n;
}

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/* The arguments of clone3 that fork_into_cgroup uses (linux/sched.h). */
struct dsec_clone_args {
	uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};

/* join_procs writes our pid to a cgroup.procs file. */
static void join_procs(const char *procs)
{
	struct dsec_msg pid = { .n = 0 };
	int fd;

	dsec_msg_uint(&pid, (unsigned long long)getpid());
	fd = open(procs, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		status_fail(errno, "join cgroup", procs);
	/* A cgroup file takes the pid in one write; a partial write fails. */
	if (dsec_write_all(fd, pid.b, pid.n) < 0)
		status_fail(errno, "join cgroup", procs);
	if (close(fd) < 0 && errno != EINTR)
		status_fail(errno, "join cgroup", procs);
}

/*
 * group_dir copies the directory of a cgroup.procs path into dir (cap
 * bytes); 0 when procs is not ".../cgroup.procs" or too long.
 */
static int group_dir(const char *procs, char *dir, size_t cap)
{
	static const char base[] = "/cgroup.procs";
	size_t n = strlen(procs), b = sizeof(base) - 1;

	if (n <= b || strcmp(procs + n - b, base) != 0 || n - b + sizeof("/tasks") > cap)
		return 0;
	memcpy(dir, procs, n - b);
	dir[n - b] = '\0';
	return 1;
}

/*
 * fork_into_cgroup forks a child born in the cgroup v2 group dir (clone3
 * with CLONE_INTO_CGROUP) and returns in the child, which carries the
 * request on; the parent waits for it and exits with its status. It
 * returns -1 in the caller, forking nothing, when the kernel cannot (before
 * Linux 5.7) or will not; errno says why.
 */
static int fork_into_cgroup(const char *dir)
{
	struct dsec_clone_args a;
	int fd, err, status;
	long pid;

	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	memset(&a, 0, sizeof(a));
	a.flags = CLONE_INTO_CGROUP;
	a.exit_signal = SIGCHLD;
	a.cgroup = (uint64_t)fd;
	pid = syscall(SYS_clone3, &a, sizeof(a));
	err = errno;
	if (pid == 0) {
		(void)close(fd);
		return 0;
	}
	(void)close(fd);
	if (pid < 0) {
		errno = err;
		return -1;
	}
	while (waitpid((pid_t)pid, &status, 0) < 0)
		if (errno != EINTR)
			_exit(1);
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

/*
 * join_cgroups puts us in the group of every cgroup.procs file of the
 * config without taking the kernel's global cgroup_threadgroup_rwsem for
 * writing where it can: writing a pid to cgroup.procs does, and the first
 * writer after a quiet spell waits for an RCU grace period (7-20 ms on a
 * 2-core VM), which every exec after an idle period paid. So the v2 group
 * (one at most) is joined by forking into it, and a v1 group by writing
 * "0" to its tasks file, which moves the calling thread alone (this
 * process has one) and skips the lock. Either falls back to cgroup.procs.
 * The v2 fork comes first, so the process that waits for it is never in
 * the sandbox's groups (its pids limit counts the helper once).
 */
static void join_cgroups(const struct config *c)
{
	char dir[PATH_MAX];
	size_t v2 = c->n_cgroup_procs;
	struct statfs st;

	for (size_t i = 0; i < c->n_cgroup_procs; i++) {
		if (group_dir(c->cgroup_procs[i], dir, sizeof(dir)) && statfs(dir, &st) == 0 &&
		    st.f_type == CGROUP2_SUPER_MAGIC) {
			v2 = i;
			break;
		}
	}
	if (v2 < c->n_cgroup_procs && (!group_dir(c->cgroup_procs[v2], dir, sizeof(dir)) || fork_into_cgroup(dir) < 0))
		join_procs(c->cgroup_procs[v2]);
	for (size_t i = 0; i < c->n_cgroup_procs; i++) {
		int fd;

		if (i == v2)
			continue;
		if (!group_dir(c->cgroup_procs[i], dir, sizeof(dir)) || statfs(dir, &st) < 0 ||
		    st.f_type == CGROUP2_SUPER_MAGIC) {
			join_procs(c->cgroup_procs[i]);
			continue;
		}
		strcat(dir, "/tasks");
		fd = open(dir, O_WRONLY | O_CLOEXEC);
		if (fd < 0) {
			join_procs(c->cgroup_procs[i]);
			continue;
		}
		if (dsec_write_all(fd, "0", 1) < 0) {
			(void)close(fd);
			join_procs(c->cgroup_procs[i]);
			continue;
		}
		if (close(fd) < 0 && errno != EINTR)
			status_fail(errno, "join cgroup", dir);
	}
}

/*
 * The namespaces a command joins. setns enters the user namespace first
 * whatever the order here, so the rest are checked against its capabilities.
 */
static const struct {
	const char *name;
	int flag;
} namespaces[] = {
	{ "user", CLONE_NEWUSER },
	{ "mnt", CLONE_NEWNS },
	{ "pid", CLONE_NEWPID },
	{ "net", CLONE_NEWNET },
	{ "uts", CLONE_NEWUTS },
	{ "ipc", CLONE_NEWIPC },
	{ "cgroup", CLONE_NEWCGROUP },
	{ "time", CLONE_NEWTIME },
};

/*
 * join_namespaces enters, with one setns call on a pidfd, every namespace
 * of the target that differs from ours. The pidfd pins the target: if it is
 * still alive (or a zombie) after we looked at /proc/<pid>/ns, the pid was
 * not reused in between, so what we compared was the target's.
 */
static void join_namespaces(const struct config *c)
{
	struct dsec_msg path;
	struct stat self, target;
	int flags = 0;
	int pidfd;

	pidfd = (int)syscall(SYS_pidfd_open, (pid_t)c->pid, 0);
	if (pidfd < 0)
		status_fail_uint(errno, "open target", c->pid);

	for (size_t i = 0; i < sizeof(namespaces) / sizeof(namespaces[0]); i++) {
		if (c->mnt_ns && namespaces[i].flag == CLONE_NEWNS)
			continue;
		path.n = 0;
		dsec_msg_str(&path, "/proc/self/ns/");
		dsec_msg_str(&path, namespaces[i].name);
		path.b[path.n] = '\0';
		if (stat(path.b, &self) < 0) {
			if (errno == ENOENT)
				continue; /* this kernel has no such namespace */
			status_fail(errno, "stat namespace", path.b);
		}
		path.n = 0;
		dsec_msg_str(&path, "/proc/");
		dsec_msg_uint(&path, c->pid);
		dsec_msg_str(&path, "/ns/");
		dsec_msg_str(&path, namespaces[i].name);
		path.b[path.n] = '\0';
		if (stat(path.b, &target) < 0)
			status_fail(errno, "stat namespace", path.b);
		if (self.st_dev != target.st_dev || self.st_ino != target.st_ino)
			flags |= namespaces[i].flag;
	}
	if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0)
		status_fail_uint(errno, "open target", c->pid);

	/*
	 * A mount namespace of its own (a sealed exec's, made by the keeper and
	 * owned by the host's user namespace) is entered instead of the
	 * target's: after the paths above were read in the host's /proc (in
	 * the new namespace /proc is the sandbox's), and before the target's
	 * user namespace, while we still have the host's capabilities.
	 */
	if (c->mnt_ns) {
		int fd = open(c->mnt_ns, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			status_fail(errno, "open mount namespace", c->mnt_ns);
		if (setns(fd, CLONE_NEWNS) < 0)
			status_fail(errno, "setns", c->mnt_ns);
		if (close(fd) < 0 && errno != EINTR)
			status_fail(errno, "setns", "close mount namespace");
		if (!(flags & CLONE_NEWUSER) || !(flags & CLONE_NEWPID))
			status_fail(EINVAL, "setns", "a mount namespace of its own needs the target's user and pid namespaces");
	}

	if (flags != 0 && setns(pidfd, flags) < 0)
		status_fail_uint(errno, "setns", c->pid);
	if (close(pidfd) < 0 && errno != EINTR)
		status_fail(errno, "setns", "close pidfd");
}

/*
 * child_fail reports a failure of C to P over the CLOEXEC pipe as
 * "<errno> <step>: <detail>" and exits 1.
 */
static void child_fail(int errfd, int err, const char *step, const char *detail) __attribute__((noreturn));
static void child_fail(int errfd, int err, const char *step, const char *detail)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_uint(&m, (unsigned long long)err);
	dsec_msg_str(&m, " ");
	dsec_msg_str(&m, step);
	dsec_msg_str(&m, ": ");
	dsec_msg_str(&m, detail);
	(void)dsec_write_all(errfd, m.b, m.n); /* P sees EOF and reports an unknown error */
	_exit(1);
}

static void child_fail_uint(int errfd, int err, const char *step, unsigned long long v) __attribute__((noreturn));
static void child_fail_uint(int errfd, int err, const char *step, unsigned long long v)
{
	struct dsec_msg m = { .n = 0 };

	dsec_msg_uint(&m, v);
	m.b[m.n] = '\0';
	child_fail(errfd, err, step, m.b);
}

/* reset_signals gives the command default dispositions and an empty mask. */
static void reset_signals(int errfd)
{
	struct sigaction sa;
	sigset_t none;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++) {
		/* EINVAL for SIGKILL, SIGSTOP and the signals libc keeps. */
		if (sigaction(sig, &sa, NULL) < 0 && errno != EINVAL)
			child_fail_uint(errfd, errno, "reset signal", (unsigned long long)sig);
	}
	if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		child_fail(errfd, errno, "reset signal mask", "");
}

/* drop_bounding_set drops every capability not in keep from the bounding set. */
static void drop_bounding_set(uint64_t keep, int errfd)
{
	for (int cap = 0; cap < 64; cap++) {
		int r = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
		if (r < 0) {
			if (errno == EINVAL)
				return; /* past the last capability of this kernel */
			child_fail_uint(errfd, errno, "read capability bounding set", (unsigned long long)cap);
		}
		if (r == 1 && !(keep & (UINT64_C(1) << cap)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
			child_fail_uint(errfd, errno, "drop capability", (unsigned long long)cap);
	}
}

/* set_filter installs a seccomp filter; returns 0, or -1 with errno set. */
static int set_filter(struct sock_filter *filter, unsigned short len)
{
	struct sock_fprog prog = { .len = len, .filter = filter };

	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0)
		return 0;
	if (errno != ENOSYS)
		return -1;
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0 ? -1 : 0;
}

static void install_filter(struct sock_filter *filter, unsigned short len)
{
	if (set_filter(filter, len) < 0)
		init_fatal("install seccomp filter");
}

static void install_seccomp(const struct config *c, int errfd)
{
	if (set_filter(c->filter, c->filter_len) < 0)
		child_fail(errfd, errno, "seccomp", "install filter");
}

/* exec_error_text names the errnos after which the command itself fails. */
static const char *exec_error_text(int err)
{
	switch (err) {
	case EACCES:
		return "permission denied";
	case EPERM:
		return "operation not permitted";
	case ENOEXEC:
		return "exec format error";
	case EISDIR:
		return "is a directory";
	case ETXTBSY:
		return "text file busy";
	case ELOOP:
		return "too many levels of symbolic links";
	case ENAMETOOLONG:
		return "file name too long";
	case ELIBBAD:
		return "accessing a corrupted shared library";
	default:
		return NULL;
	}
}

/*
 * exec_failed ends C after execve failed. A missing or unusable program is
 * the command's own result (127 or 126, as a shell does), told on its
 * stderr; anything else (E2BIG, ENOMEM, ...) is a setup failure for P.
 */
static void exec_failed(int err, const char *argv0, int errfd) __attribute__((noreturn));
static void exec_failed(int err, const char *argv0, int errfd)
{
	struct dsec_msg m = { .n = 0 };
	const char *text;
	int code;

	if (err == ENOENT || err == ENOTDIR) {
		text = strchr(argv0, '/') ? "no such file or directory" : "command not found";
		code = 127;
	} else if ((text = exec_error_text(err)) != NULL) {
		code = 126;
	} else {
		child_fail(errfd, err, "exec", argv0);
	}
	dsec_msg_str(&m, "dsec: ");
	dsec_msg_str(&m, argv0);
	dsec_msg_str(&m, ": ");
	dsec_msg_str(&m, text);
	if (m.n == sizeof(m.b))
		m.n--;
	m.b[m.n++] = '\n';
	(void)dsec_write_all(2, m.b, m.n); /* the exit code says it all if stderr is gone */
	_exit(code);
}

/* find_path returns the value of PATH in envp, or the default. */
static const char *find_path(char *const *envp)
{
	for (; *envp; envp++)
		if (strncmp(*envp, "PATH=", 5) == 0)
			return *envp + 5;
	return DEFAULT_PATH;
}

/*
 * do_exec runs argv[0], searching PATH from the command's environment when
 * it has no '/'. Like execvp, it goes on past directories where the program
 * is missing or not accessible and stops at any other error.
 */
static void do_exec(const struct config *c, int errfd) __attribute__((noreturn));
static void do_exec(const struct config *c, int errfd)
{
	const char *file = c->argv[0];
	const char *p;
	size_t flen = strlen(file);
	int err = ENOENT;
	char buf[PATH_MAX];

	if (strchr(file, '/')) {
		execve(file, c->argv, c->envp);
		exec_failed(errno, file, errfd);
	}
	for (p = find_path(c->envp);; p++) {
		const char *end = strchrnul(p, ':');
		size_t dlen = (size_t)(end - p);

		/* An empty element means the working directory. */
		if (dlen == 0) {
			p = ".";
			dlen = 1;
		}
		if (dlen + 1 + flen + 1 > sizeof(buf)) {
			err = ENAMETOOLONG;
		} else {
			memcpy(buf, p, dlen);
			buf[dlen] = '/';
			memcpy(buf + dlen + 1, file, flen + 1);
			execve(buf, c->argv, c->envp);
			switch (errno) {
			case EACCES:
				err = EACCES;
				/* fallthrough */
			case ENOENT:
			case ENOTDIR:
			case ESTALE:
			case ENODEV:
			case ETIMEDOUT:
				break;
			default:
				exec_failed(errno, file, errfd);
			}
		}
		if (*end == '\0')
			break;
		p = end;
	}
	exec_failed(err, file, errfd);
}

/* child_main is C: it sets up the process and runs the command. */
static void child_main(const struct config *c, int errfd) __attribute__((noreturn));
static void child_main(const struct config *c, int errfd)
{
	/* The command gets fds 0-2 only; everything else of ours is CLOEXEC. */
	if (close(status_fd) < 0 && errno != EINTR)
		child_fail(errfd, errno, "close", "status fd");
	reset_signals(errfd);

	if (c->setsid && setsid() < 0)
		child_fail(errfd, errno, "setsid", "");
	if (c->tty && ioctl(0, TIOCSCTTY, 0) < 0)
		child_fail(errfd, errno, "set controlling terminal", "stdin");

	drop_bounding_set(c->keep_caps, errfd);

	/*
	 * Without no_new_privs, seccomp needs CAP_SYS_ADMIN, which a non-root
	 * user loses at setresuid: install the filter while we still have it.
	 */
	if (c->filter && !c->no_new_privs)
		install_seccomp(c, errfd);

	if (setgroups(c->n_groups, c->groups) < 0)
		child_fail(errfd, errno, "setgroups", "");
	if (setresgid(c->gid, c->gid, c->gid) < 0)
		child_fail_uint(errfd, errno, "setresgid", c->gid);
	if (setresuid(c->uid, c->uid, c->uid) < 0)
		child_fail_uint(errfd, errno, "setresuid", c->uid);

	/* After setns the root and cwd are the sandbox's; chdir as the user. */
	if (c->cwd && chdir(c->cwd) < 0)
		child_fail(errfd, errno, "chdir", c->cwd);

	if (c->no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(errfd, errno, "no_new_privs", "");
	if (c->filter && c->no_new_privs)
		install_seccomp(c, errfd);

	do_exec(c, errfd);
}

void dsec_exec_request(const uint8_t *config, size_t len, int sfd)
{
	struct config c;
	struct dsec_msg m = { .n = 0 };
	char errbuf[1024];
	int errpipe[2];
	ssize_t n;
	pid_t pid;

	status_fd = sfd;
	parse_config(config, len, &c);
	join_cgroups(&c);
	join_namespaces(&c);

	if (pipe2(errpipe, O_CLOEXEC) < 0)
		status_fail(errno, "pipe", "");
	pid = fork();
	if (pid < 0)
		status_fail(errno, "fork", "");
	if (pid == 0) {
		if (close(errpipe[0]) < 0 && errno != EINTR)
			child_fail(errpipe[1], errno, "close", "error pipe");
		child_main(&c, errpipe[1]);
	}
	if (close(errpipe[1]) < 0 && errno != EINTR)
		status_fail(errno, "close", "error pipe");

	/* EOF without a word: execve succeeded, or C took the 126/127 path. */
	n = read_full(errpipe[0], errbuf, sizeof(errbuf) - 1);
	if (n < 0)
		status_fail(errno, "read", "error pipe");
	if (n > 0) {
		int status;
		errbuf[n] = '\0';
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
		dsec_msg_str(&m, "err ");
		dsec_msg_str(&m, errbuf);
		if (m.n == sizeof(m.b))
			m.n--;
		m.b[m.n++] = '\n';
	} else {
		dsec_msg_str(&m, "ok ");
		dsec_msg_uint(&m, (unsigned long long)pid);
		dsec_msg_str(&m, "\n");
	}
	if (dsec_write_all(status_fd, m.b, m.n) < 0)
		_exit(1);
	_exit(0);
}

static void run_exec(void) __attribute__((noreturn));
static void run_exec(void)
{
	uint8_t *config;
	size_t len;

	/* Without the status fd nobody can hear us: say so on stderr. */
	if (fcntl(STATUS_FD, F_GETFD) < 0 || fcntl(CONFIG_FD, F_GETFD) < 0) {
		static const char text[] = "dsec: " MODE_ENV "=exec needs fds 3 and 4 (started by nsexec.Spawn)\n";
		(void)dsec_write_all(2, text, sizeof(text) - 1);
		_exit(1);
	}
	status_fd = STATUS_FD;
	/* Keep the sandbox's processes from ptracing us or reading our fds. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		status_fail(errno, "set not dumpable", "");
	/* Only 0-4 are ours to pass on; the status fd must not reach the command. */
	dsec_close_from(STATUS_FD + 1);
	if (fcntl(STATUS_FD, F_SETFD, FD_CLOEXEC) < 0)
		status_fail(errno, "set close-on-exec", "status fd");

	len = read_config(&config);
	dsec_exec_request(config, len, STATUS_FD);
}

/* ---------------------------------------------------------------------
 * pause mode
 */

static void run_pause(void) __attribute__((noreturn));
static void run_pause(void)
{
	sigset_t all;

	dsec_close_from(3);
	if (sigfillset(&all) < 0 || sigprocmask(SIG_BLOCK, &all, NULL) < 0)
		_exit(1);
	for (;;) {
		siginfo_t si;
		if (sigwaitinfo(&all, &si) < 0 && errno != EINTR)
			_exit(1);
	}
}

/* ---------------------------------------------------------------------
 * userns mode
 *
 * The keeper starts the helper as the sandbox's host root uid, with a
 * stream socket on USERNS_FD. The helper makes a user namespace (so that
 * the namespace is owned by that uid, and the kernel charges the sandbox's
 * namespaces, inotify instances and other per-user counts to it rather than
 * to the host's root) and says "ready\n". The keeper writes the
 * namespace's id maps, then sends the limits to set inside it, one
 * "<name> <value>\n" line per file of /proc/sys/user, ended by an empty
 * line; the helper, which holds every capability in the new namespace,
 * writes them and answers "ok\n" (or "err <errno> <step>: <detail>\n" and
 * exits). It then holds the namespace until the socket closes.
 */

#define USERNS_MAX_REQUEST 4096

static void userns_fail(int err, const char *step, const char *detail) __attribute__((noreturn));
static void userns_fail(int err, const char *step, const char *detail)
{
	(void)dsec_report(USERNS_FD, err, step, detail);
	_exit(1);
}

/* userns_limit writes value to /proc/sys/user/<name>. */
static void userns_limit(const char *name, const char *value)
{
	struct dsec_msg path = { .n = 0 };
	int fd;

	for (const char *p = name; *p; p++)
		if (!(*p >= 'a' && *p <= 'z') && *p != '_')
			userns_fail(EINVAL, "limit name", name);
	for (const char *p = value; *p; p++)
		if (*p < '0' || *p > '9')
			userns_fail(EINVAL, "limit value", value);
	if (name[0] == '\0' || value[0] == '\0')
		userns_fail(EINVAL, "limit", "empty name or value");
	dsec_msg_str(&path, "/proc/sys/user/");
	dsec_msg_str(&path, name);
	if (path.n >= sizeof(path.b))
		userns_fail(ENAMETOOLONG, "limit", name);
	path.b[path.n] = '\0';
	fd = open(path.b, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		userns_fail(errno, "open limit", path.b);
	if (dsec_write_all(fd, value, strlen(value)) < 0)
		userns_fail(errno, "write limit", path.b);
	if (close(fd) < 0 && errno != EINTR)
		userns_fail(errno, "write limit", path.b);
}

static void run_userns(void) __attribute__((noreturn));
static void run_userns(void)
{
	static char req[USERNS_MAX_REQUEST + 1];
	size_t got = 0;
	char *line;

	if (fcntl(USERNS_FD, F_GETFD) < 0) {
		static const char text[] = "dsec: " MODE_ENV "=userns needs fd 3 (started by the keeper)\n";
		(void)dsec_write_all(2, text, sizeof(text) - 1);
		_exit(1);
	}
	/*
	 * No parent-death signal: it fires when the forking thread ends, which
	 * a Go parent does not control. The helper ends when the socket
	 * closes instead, which a dying keeper does too.
	 */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		userns_fail(errno, "set not dumpable", "");
	dsec_close_from(USERNS_FD + 1);
	if (unshare(CLONE_NEWUSER) < 0)
		userns_fail(errno, "unshare", "user namespace");
	if (dsec_write_all(USERNS_FD, "ready\n", 6) < 0)
		_exit(1);

	/* The limits, ended by an empty line. */
	for (;;) {
		ssize_t n;

		if (got >= 2 && req[got - 1] == '\n' && req[got - 2] == '\n')
			break;
		if (got == 1 && req[0] == '\n')
			break;
		if (got == USERNS_MAX_REQUEST)
			userns_fail(EFBIG, "limits", "request larger than 4 KiB");
		n = read(USERNS_FD, req + got, USERNS_MAX_REQUEST - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			userns_fail(errno, "read limits", "");
		if (n == 0)
			_exit(1); /* the keeper gave up */
		got += (size_t)n;
	}
	req[got] = '\0';
	for (line = req; *line != '\n';) {
		char *end = strchr(line, '\n');
		char *sp = strchr(line, ' ');

		if (sp == NULL || sp > end)
			userns_fail(EINVAL, "limits", "line without a value");
		*sp = '\0';
		*end = '\0';
		userns_limit(line, sp + 1);
		line = end + 1;
	}
	if (dsec_write_all(USERNS_FD, "ok\n", 3) < 0)
		_exit(1);

	/* Hold the namespace until the keeper closes its end. */
	for (;;) {
		char c;
		ssize_t n = read(USERNS_FD, &c, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			_exit(0);
	}
}

/* ---------------------------------------------------------------------
 * The constructor.
 */

__attribute__((constructor)) static void dsec_nsexec(void)
{
	const char *mode = getenv(MODE_ENV);

	if (mode == NULL || mode[0] == '\0')
		return;
	if (strcmp(mode, "init") == 0)
		run_init();
	if (strcmp(mode, "exec") == 0)
		run_exec();
	if (strcmp(mode, "zygote") == 0)
		dsec_run_zygote();
	if (strcmp(mode, "userns") == 0)
		run_userns();
	if (strcmp(mode, "pause") == 0)
		run_pause();

	static const char text[] = "dsec: unknown " MODE_ENV " mode (want init, exec, zygote, userns or pause)\n";
	(void)dsec_write_all(2, text, sizeof(text) - 1);
	_exit(2);
}
