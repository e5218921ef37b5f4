/* Per-peer HTTP connection limits (http_guard.h). */
#include "http_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* Peer keys: a kind in the top byte, so that a uid never equals an address. */
#define PEER_UID (1ull << 56)
#define PEER_ADDR (2ull << 56)

void gm_http_guard_init(gm_http_guard_t *g) {
        for (unsigned i = 0; i < GM_HTTP_CONNECTIONS; i++)
                g->slots[i].fd = -1;
}

/* The owner of the peer's end of loopback TCP connection fd, by an exact
 * sock_diag lookup of that socket (no privileges needed). */
static int loopback_peer_uid(int fd, const struct sockaddr *peer, uid_t *ret_uid) {
        struct sockaddr_storage self;
        socklen_t self_len = sizeof(self);
        if (getsockname(fd, (struct sockaddr *) &self, &self_len) < 0)
                return -errno;
        struct {
                struct nlmsghdr nlh;
                struct inet_diag_req_v2 req;
        } msg = {
                .nlh = {.nlmsg_len = sizeof(msg), .nlmsg_type = SOCK_DIAG_BY_FAMILY, .nlmsg_flags = NLM_F_REQUEST},
                .req = {.sdiag_family = (uint8_t) peer->sa_family,
                        .sdiag_protocol = IPPROTO_TCP,
                        .idiag_states = ~0u,
                        .id.idiag_cookie = {INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE}},
        };
        /* The peer's socket: its source is the peer address, its destination us. */
        if (peer->sa_family == AF_INET) {
                const struct sockaddr_in *p = (const struct sockaddr_in *) peer,
                                         *s = (const struct sockaddr_in *) &self;
                msg.req.id.idiag_sport = p->sin_port;
                msg.req.id.idiag_dport = s->sin_port;
                memcpy(msg.req.id.idiag_src, &p->sin_addr, 4);
                memcpy(msg.req.id.idiag_dst, &s->sin_addr, 4);
        } else {
                const struct sockaddr_in6 *p = (const struct sockaddr_in6 *) peer,
                                          *s = (const struct sockaddr_in6 *) &self;
                msg.req.id.idiag_sport = p->sin6_port;
                msg.req.id.idiag_dport = s->sin6_port;
                memcpy(msg.req.id.idiag_src, &p->sin6_addr, 16);
                memcpy(msg.req.id.idiag_dst, &s->sin6_addr, 16);
        }
        int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
        if (nl < 0)
                return -errno;
        struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
        union {
                struct nlmsghdr nlh;
                char buf[1024];
        } reply;
        ssize_t n = -1;
        if (sendto(nl, &msg, sizeof(msg), 0, (struct sockaddr *) &kernel, sizeof(kernel)) == (ssize_t) sizeof(msg))
                n = recv(nl, &reply, sizeof(reply), 0);
        int r = n < 0 ? -errno : 0;
        close(nl);
        if (r < 0)
                return r;
        if (n < (ssize_t) NLMSG_LENGTH(sizeof(struct inet_diag_msg)) || reply.nlh.nlmsg_type != SOCK_DIAG_BY_FAMILY)
                return -ENOENT; /* NLMSG_ERROR: the peer is gone (or not local) */
        const struct inet_diag_msg *m = NLMSG_DATA(&reply.nlh);
        *ret_uid = m->idiag_uid;
        return 0;
}

static bool is_loopback(const struct sockaddr *a) {
        if (a->sa_family == AF_INET)
                return (ntohl(((const struct sockaddr_in *) a)->sin_addr.s_addr) >> 24) == 127;
        if (a->sa_family == AF_INET6) {
                const struct in6_addr *x = &((const struct sockaddr_in6 *) a)->sin6_addr;
                return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
        }
        return false;
}

/* The peer's key: PEER_UID | uid where the kernel can name it, else PEER_ADDR
 * with the address (IPv6: its /64 folded, so one host's addresses count once). */
static uint64_t peer_key(int fd, const struct sockaddr *addr, socklen_t addrlen) {
        uid_t uid;
        if (addrlen == 0 || addr->sa_family == AF_UNIX) {
                struct ucred uc;
                socklen_t len = sizeof(uc);
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0)
                        return PEER_UID | uc.uid;
                return PEER_ADDR;
        }
        if (is_loopback(addr) && loopback_peer_uid(fd, addr, &uid) == 0)
                return PEER_UID | uid;
        if (addr->sa_family == AF_INET)
                return PEER_ADDR | ntohl(((const struct sockaddr_in *) addr)->sin_addr.s_addr);
        uint64_t prefix;
        memcpy(&prefix, ((const struct sockaddr_in6 *) addr)->sin6_addr.s6_addr, sizeof(prefix));
        return PEER_ADDR | ((prefix ^ (prefix >> 8)) & ((1ull << 56) - 1));
}

bool gm_http_guard_admit(gm_http_guard_t *g, int fd, const struct sockaddr *addr, socklen_t addrlen) {
        uint64_t key = peer_key(fd, addr, addrlen);
        unsigned held = 0;
        int free_slot = -1;
        for (unsigned i = 0; i < GM_HTTP_CONNECTIONS; i++) {
                if (g->slots[i].fd < 0)
                        free_slot = free_slot < 0 ? (int) i : free_slot;
                else if (g->slots[i].peer == key)
                        held++;
        }
        if (free_slot < 0 || held >= GM_HTTP_PER_PEER)
                return false;
        g->slots[free_slot].fd = fd;
        g->slots[free_slot].peer = key;
        return true;
}

void gm_http_guard_release(gm_http_guard_t *g, int fd) {
        for (unsigned i = 0; i < GM_HTTP_CONNECTIONS; i++)
                if (g->slots[i].fd == fd) {
                        g->slots[i].fd = -1;
                        return;
                }
}
