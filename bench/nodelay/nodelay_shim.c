/* LD_PRELOAD shim for the SLIM side of bench/e2e.py: forces TCP_NODELAY on SLIM's TCP
 * sockets so the comparison is against SLIM at its best. SLIM's client sets
 * TCP_NODELAY to false explicitly and its node never sets it on accepted sockets; with
 * Nagle's algorithm and delayed ACKs a round trip takes ~88 ms instead of ~1 ms.
 *   (a) any setsockopt(TCP_NODELAY, ...) is turned into TCP_NODELAY = 1;
 *   (b) every socket returned by accept/accept4, and every socket passed to connect,
 *       gets TCP_NODELAY = 1 (errno preserved: a non-blocking connect's EINPROGRESS).
 * The bench compiles it at run time: gcc -O2 -shared -fPIC -o nodelay_shim.so nodelay_shim.c -ldl
 * Adapted from the reference harness (peer-slim/shim/nodelay_shim.c). Never used for svc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);

static void set_nodelay(int fd) {
    if (!real_setsockopt) real_setsockopt = dlsym(RTLD_NEXT, "setsockopt");
    int one = 1;
    real_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on non-TCP */
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
    if (!real_setsockopt) real_setsockopt = dlsym(RTLD_NEXT, "setsockopt");
    if (level == IPPROTO_TCP && name == TCP_NODELAY) {
        int one = 1;
        return real_setsockopt(fd, level, name, &one, sizeof one);
    }
    return real_setsockopt(fd, level, name, val, len);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    if (!real_accept4) real_accept4 = dlsym(RTLD_NEXT, "accept4");
    int r = real_accept4(fd, addr, len, flags);
    if (r >= 0) set_nodelay(r);
    return r;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    if (!real_accept) real_accept = dlsym(RTLD_NEXT, "accept");
    int r = real_accept(fd, addr, len);
    if (r >= 0) set_nodelay(r);
    return r;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    if (!real_connect) real_connect = dlsym(RTLD_NEXT, "connect");
    int r = real_connect(fd, addr, len);
    int saved = errno;
    if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) set_nodelay(fd);
    errno = saved;
    return r;
}
