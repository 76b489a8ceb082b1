/*
 * Declarations shared by nsexec_linux.c (constructor, init and exec modes)
 * and zygote_linux.c (zygote mode), and the zygote's wire constants, which
 * zygote_linux.go reads through cgo so that both sides use the same numbers.
 */
#ifndef DSEC_NSEXEC_LINUX_H
#define DSEC_NSEXEC_LINUX_H

#include <stddef.h>
#include <stdint.h>

/* The largest encoded ExecConfig; config.go's MaxConfigSize. */
#define DSEC_MAX_CONFIG (1 << 20)

/*
 * The zygote protocol (see doc.go). Once set up, the zygote sends one
 * message, the u32 DSEC_ZYGOTE_MAGIC_READY; it sends nothing else. A
 * request is one message, or one message and continuations when the config
 * is larger than a chunk:
 *
 *   first message: u32 DSEC_ZYGOTE_MAGIC_FIRST, u32 config length,
 *                  the config's first bytes (at most DSEC_ZYGOTE_CHUNK),
 *                  SCM_RIGHTS: status, stdin, stdout, stderr
 *   continuation:  u32 DSEC_ZYGOTE_MAGIC_NEXT, u32 offset of its bytes,
 *                  the next bytes (at most DSEC_ZYGOTE_CHUNK), no fds
 *
 * Words are little-endian. The answer is the exec helper's status line,
 * written to the request's status descriptor.
 */
#define DSEC_ZYGOTE_SOCK_FD 3
#define DSEC_ZYGOTE_HEADER 8
#define DSEC_ZYGOTE_CHUNK (64 * 1024)
#define DSEC_ZYGOTE_NFDS 4
#define DSEC_ZYGOTE_MAGIC_FIRST 0x315a5344u /* "DSZ1" */
#define DSEC_ZYGOTE_MAGIC_NEXT 0x2b5a5344u /* "DSZ+" */
#define DSEC_ZYGOTE_MAGIC_READY 0x215a5344u /* "DSZ!" */

/* A message under construction; silently truncated when full. */
struct dsec_msg {
	char b[1024];
	size_t n;
};

void dsec_msg_str(struct dsec_msg *m, const char *s);
void dsec_msg_uint(struct dsec_msg *m, unsigned long long v);

/* dsec_write_all writes len bytes; returns 0, or -1 with errno set. */
int dsec_write_all(int fd, const void *buf, size_t len);

/* dsec_close_from closes every descriptor >= lowfd. */
void dsec_close_from(unsigned int lowfd);

/*
 * dsec_report writes the status line "err <errno> <step>: <detail>\n" to
 * fd. Returns 0, or -1 with errno set.
 */
int dsec_report(int fd, int err, const char *step, const char *detail);

/*
 * dsec_exec_request does what the exec helper does with a config it has
 * read: decode it, join the cgroups and namespaces, fork the command and
 * report on status_fd. The caller has made fds 0-2 the command's stdio and
 * status_fd close-on-exec, and holds no other descriptor.
 */
void dsec_exec_request(const uint8_t *config, size_t len, int status_fd) __attribute__((noreturn));

/* dsec_run_zygote is the zygote mode. */
void dsec_run_zygote(void) __attribute__((noreturn));

#endif
