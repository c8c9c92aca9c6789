/* Control channel, key store, access policy. See README.md for the wire format. */
#define _GNU_SOURCE
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define FUSE_USE_VERSION 312

#include "fs.h"

/* ---- big-endian helpers ------------------------------------------------------- */
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A bounds-checked reader over one message's payload. */
struct rd { const uint8_t *p; size_t left; int bad; };
static const uint8_t *take(struct rd *r, size_t n)
{
	if (r->bad || r->left < n) { r->bad = 1; return NULL; }
	const uint8_t *p = r->p;
	r->p += n;
	r->left -= n;
	return p;
}
static uint32_t rd8(struct rd *r) { const uint8_t *p = take(r, 1); return p ? p[0] : 0; }
static uint32_t rd16(struct rd *r) { const uint8_t *p = take(r, 2); return p ? get16(p) : 0; }
static uint32_t rd32(struct rd *r) { const uint8_t *p = take(r, 4); return p ? get32(p) : 0; }

/* ---- outgoing queue: one writer thread, FUSE threads never block on the socket ---- */
struct out_msg { struct out_msg *next; size_t len; uint8_t data[]; };
#define EVENT_QUEUE_MAX 4096

static int ctl_fd = -1;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t out_cond = PTHREAD_COND_INITIALIZER;
static struct out_msg *out_head, *out_tail;
static size_t out_events;
static int out_closing;
static uint64_t events_sent, events_dropped;
static pthread_t reader_thread, writer_thread;
static int threads_started;

static void enqueue(uint16_t type, uint32_t seq, const uint8_t *payload, size_t len, int is_event)
{
	if (ctl_fd < 0)
		return;
	struct out_msg *m = malloc(sizeof(*m) + 12 + len);
	pthread_mutex_lock(&out_lock);
	if (!m || out_closing || (is_event && out_events >= EVENT_QUEUE_MAX)) {
		if (is_event)
			events_dropped++;
		pthread_mutex_unlock(&out_lock);
		free(m);
		return;
	}
	m->next = NULL;
	m->len = 12 + len;
	put32(m->data, (uint32_t)(8 + len));
	put16(m->data + 4, SR_PROTO_VERSION);
	put16(m->data + 6, type);
	put32(m->data + 8, seq);
	if (len)
		memcpy(m->data + 12, payload, len);
	if (out_tail)
		out_tail->next = m;
	else
		out_head = m;
	out_tail = m;
	if (is_event) {
		out_events++;
		events_sent++;
	}
	pthread_cond_signal(&out_cond);
	pthread_mutex_unlock(&out_lock);
}

static void *writer_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&out_lock);
		while (!out_head && !out_closing)
			pthread_cond_wait(&out_cond, &out_lock);
		struct out_msg *m = out_head;
		if (!m) { /* closing and drained */
			pthread_mutex_unlock(&out_lock);
			return NULL;
		}
		out_head = m->next;
		if (!out_head)
			out_tail = NULL;
		if (get16(m->data + 6) == SR_MSG_EVENT)
			out_events--;
		pthread_mutex_unlock(&out_lock);
		size_t done = 0;
		while (done < m->len) {
			ssize_t n = send(ctl_fd, m->data + done, m->len - done, MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break; /* the plane is gone: the reader sees EOF and shuts down */
			done += (size_t)n;
		}
		free(m);
	}
}

/* ---- keys: one locked, non-dumpable page, wiped on drop, shutdown and exit ------- */
struct key_slot { uint8_t id[16]; uint32_t version; uint32_t used; uint8_t key[32]; };
#define KEY_SLOTS 64
static struct key_slot *keys; /* mmap'ed, mlock'ed, MADV_DONTDUMP */
static size_t keys_len;
static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;

static int keys_init(void)
{
	keys_len = sizeof(struct key_slot) * KEY_SLOTS;
	long page = sysconf(_SC_PAGESIZE);
	keys_len = (keys_len + (size_t)page - 1) / (size_t)page * (size_t)page;
	void *p = mmap(NULL, keys_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	/* mlock by its system call: AddressSanitizer's interceptor makes mlock() a no-op */
	if (syscall(SYS_mlock, p, keys_len) < 0 || madvise(p, keys_len, MADV_DONTDUMP) < 0) {
		int e = errno;
		munmap(p, keys_len);
		return -e;
	}
	(void)madvise(p, keys_len, MADV_WIPEONFORK);
	keys = p;
	return 0;
}

/* The key version new files are written under (SET_ACTIVE); it must be held. */
static uint8_t active_id[16];
static uint32_t active_version; /* 0: none; under keys_lock */

static int key_set(const uint8_t id[16], uint32_t version, const uint8_t key[32])
{
	if (!keys)
		return -ENOMEM;
	pthread_mutex_lock(&keys_lock);
	struct key_slot *free_slot = NULL;
	for (int i = 0; i < KEY_SLOTS; i++) {
		struct key_slot *s = &keys[i];
		if (s->used && s->version == version && !memcmp(s->id, id, 16)) {
			free_slot = s;
			break;
		}
		if (!s->used && !free_slot)
			free_slot = s;
	}
	if (!free_slot) {
		pthread_mutex_unlock(&keys_lock);
		return -ENOSPC;
	}
	memcpy(free_slot->id, id, 16);
	free_slot->version = version;
	memcpy(free_slot->key, key, 32);
	free_slot->used = 1;
	pthread_mutex_unlock(&keys_lock);
	return 0;
}

static int key_drop(const uint8_t id[16], uint32_t version)
{
	int found = 0;
	if (!keys)
		return -ENOKEY;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < KEY_SLOTS; i++) {
		struct key_slot *s = &keys[i];
		if (s->used && !memcmp(s->id, id, 16) && (version == 0 || s->version == version)) {
			if (active_version == s->version && !memcmp(active_id, id, 16))
				active_version = 0; /* no new file under a dropped key */
			explicit_bzero(s, sizeof(*s));
			found = 1;
		}
	}
	pthread_mutex_unlock(&keys_lock);
	return found ? 0 : -ENOKEY;
}

int sr_key_get(const uint8_t id[16], uint32_t version, uint8_t out[32])
{
	int r = -ENOKEY;
	if (!keys)
		return r;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < KEY_SLOTS; i++) {
		if (keys[i].used && keys[i].version == version && !memcmp(keys[i].id, id, 16)) {
			memcpy(out, keys[i].key, 32);
			r = 0;
			break;
		}
	}
	pthread_mutex_unlock(&keys_lock);
	return r;
}


static int key_activate(const uint8_t id[16], uint32_t version)
{
	uint8_t probe[32];
	int r = sr_key_get(id, version, probe);
	explicit_bzero(probe, sizeof(probe));
	if (r < 0)
		return r;
	pthread_mutex_lock(&keys_lock);
	memcpy(active_id, id, 16);
	active_version = version;
	pthread_mutex_unlock(&keys_lock);
	return 0;
}

int sr_key_active(uint8_t id[16], uint32_t *version)
{
	pthread_mutex_lock(&keys_lock);
	memcpy(id, active_id, 16);
	*version = active_version;
	pthread_mutex_unlock(&keys_lock);
	return *version ? 0 : -ENOKEY;
}

static uint32_t keys_count(void)
{
	uint32_t n = 0;
	if (!keys)
		return 0;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < KEY_SLOTS; i++)
		n += keys[i].used ? 1 : 0;
	pthread_mutex_unlock(&keys_lock);
	return n;
}

void sr_keys_wipe(void)
{
	if (!keys)
		return;
	pthread_mutex_lock(&keys_lock);
	explicit_bzero(keys, keys_len);
	active_version = 0;
	pthread_mutex_unlock(&keys_lock);
}

/* ---- policy: immutable tables, swapped whole under a write lock ------------------ */
struct rule {
	int permit, access, audit;
	uint32_t n_users, n_uids, n_gids, n_exes;
	uint32_t *users, *uids, *gids; /* users: uids the plane resolved from user names */
	char **exes;
};
struct policy {
	int mode, default_permit;
	uint32_t nrules;
	int needs_exe;
	uint64_t generation;
	struct rule *rules;
};

static pthread_rwlock_t policy_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct policy *policy; /* NULL = mode off */
static uint64_t policy_generation;

static void policy_free(struct policy *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->nrules; i++) {
		struct rule *r = &p->rules[i];
		free(r->users);
		free(r->uids);
		free(r->gids);
		for (uint32_t j = 0; j < r->n_exes; j++)
			free(r->exes[j]);
		free(r->exes);
	}
	free(p->rules);
	free(p);
}

static uint32_t *parse_ids(struct rd *r, uint32_t *n)
{
	*n = rd16(r);
	uint32_t *ids = calloc(*n ? *n : 1, sizeof(uint32_t));
	if (!ids) {
		r->bad = 1;
		return NULL;
	}
	for (uint32_t i = 0; i < *n; i++)
		ids[i] = rd32(r);
	return ids;
}

static struct policy *policy_parse(const uint8_t *payload, size_t len)
{
	struct rd r = { payload, len, 0 };
	struct policy *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->mode = (int)rd8(&r);
	p->default_permit = (int)rd8(&r);
	p->nrules = rd16(&r);
	if (r.bad || p->mode > SR_MODE_LEARN || p->default_permit > 1) {
		free(p);
		return NULL;
	}
	p->rules = calloc(p->nrules ? p->nrules : 1, sizeof(struct rule));
	if (!p->rules) {
		free(p);
		return NULL;
	}
	uint32_t parsed = 0;
	for (; parsed < p->nrules && !r.bad; parsed++) {
		struct rule *ru = &p->rules[parsed];
		ru->permit = (int)rd8(&r);
		ru->access = (int)rd8(&r);
		ru->audit = (int)rd8(&r);
		(void)rd8(&r);
		if (ru->permit > 1 || ru->access < 1 || ru->access > 3 || ru->audit > 1)
			r.bad = 1;
		ru->users = parse_ids(&r, &ru->n_users);
		ru->uids = parse_ids(&r, &ru->n_uids);
		ru->gids = parse_ids(&r, &ru->n_gids);
		ru->n_exes = rd16(&r);
		ru->exes = calloc(ru->n_exes ? ru->n_exes : 1, sizeof(char *));
		if (!ru->exes) {
			r.bad = 1;
			ru->n_exes = 0;
		}
		for (uint32_t j = 0; j < ru->n_exes; j++) {
			uint32_t l = rd16(&r);
			const uint8_t *s = take(&r, l);
			ru->exes[j] = s ? strndup((const char *)s, l) : NULL;
			if (!ru->exes[j] || strlen(ru->exes[j]) != l)
				r.bad = 1;
		}
		if (ru->n_exes)
			p->needs_exe = 1;
	}
	p->nrules = parsed; /* what policy_free must release */
	if (r.bad || r.left) {
		policy_free(p);
		return NULL;
	}
	return p;
}

int sr_policy_active(void)
{
	pthread_rwlock_rdlock(&policy_lock);
	int on = policy && policy->mode != SR_MODE_OFF;
	pthread_rwlock_unlock(&policy_lock);
	return on;
}

static int has_id(const uint32_t *ids, uint32_t n, uint32_t id)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

static int caller_in_groups(const struct sr_caller *c, const struct rule *r)
{
	if (has_id(r->gids, r->n_gids, c->gid))
		return 1;
	for (int i = 0; i < c->ngroups; i++)
		if (has_id(r->gids, r->n_gids, c->groups[i]))
			return 1;
	return 0;
}

static void caller_exe(pid_t pid, char *buf, size_t len)
{
	char link[64];
	snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
	ssize_t n = readlink(link, buf, len - 1);
	buf[n > 0 ? n : 0] = '\0'; /* the process exited: match on ids only, as the Python rules */
}

static int rule_matches(const struct rule *r, const struct sr_caller *c, int want, const char *exe)
{
	if (r->access != SR_ACCESS_ALL && r->access != want)
		return 0;
	if (r->n_users && !has_id(r->users, r->n_users, c->uid))
		return 0;
	if (r->n_uids && !has_id(r->uids, r->n_uids, c->uid))
		return 0;
	if (r->n_gids && !caller_in_groups(c, r))
		return 0;
	if (r->n_exes) {
		for (uint32_t i = 0; i < r->n_exes; i++)
			if (exe[0] && !strcmp(r->exes[i], exe))
				return 1;
		return 0;
	}
	return 1;
}

void sr_event_send(enum sr_event_kind kind, int access, enum sr_op op, const struct sr_caller *c,
		   int rule, const char *path)
{
	if (ctl_fd < 0)
		return;
	char exe[PATH_MAX];
	caller_exe(c->pid, exe, sizeof(exe));
	size_t pl = path ? strnlen(path, 60000) : 0, el = strnlen(exe, 4096);
	uint8_t *b = malloc(24 + 2 + pl + 2 + el);
	if (!b)
		return;
	int mode = SR_MODE_OFF;
	pthread_rwlock_rdlock(&policy_lock);
	if (policy)
		mode = policy->mode;
	pthread_rwlock_unlock(&policy_lock);
	b[0] = (uint8_t)kind;
	b[1] = (uint8_t)access;
	b[2] = (uint8_t)op;
	b[3] = (uint8_t)mode;
	put32(b + 4, (uint32_t)c->uid);
	put32(b + 8, (uint32_t)c->gid);
	put32(b + 12, (uint32_t)c->pid);
	put32(b + 16, (uint32_t)rule);
	put32(b + 20, 0);
	put16(b + 24, (uint16_t)pl);
	memcpy(b + 26, path, pl);
	put16(b + 26 + pl, (uint16_t)el);
	memcpy(b + 28 + pl, exe, el);
	enqueue(SR_MSG_EVENT, 0, b, 28 + pl + el, 1);
	free(b);
}

static int decide_one(const struct sr_caller *c, int want, enum sr_op op, const char *path)
{
	char exe[PATH_MAX] = "";
	int allowed, would, audit, rule = -1;
	pthread_rwlock_rdlock(&policy_lock);
	struct policy *p = policy;
	if (!p || p->mode == SR_MODE_OFF) {
		pthread_rwlock_unlock(&policy_lock);
		return 0;
	}
	if (p->needs_exe)
		caller_exe(c->pid, exe, sizeof(exe));
	would = p->default_permit;
	audit = !would;
	for (uint32_t i = 0; i < p->nrules; i++) {
		if (rule_matches(&p->rules[i], c, want, exe)) {
			rule = (int)i;
			would = p->rules[i].permit;
			audit = p->rules[i].audit || !would;
			break;
		}
	}
	allowed = would || p->mode == SR_MODE_LEARN;
	pthread_rwlock_unlock(&policy_lock);
	if (audit)
		sr_event_send(!allowed ? SR_EV_DENIED : !would ? SR_EV_WOULD_DENY : SR_EV_PERMITTED,
			      want, op, c, rule, path);
	return allowed ? 0 : -EACCES;
}

int sr_policy_check(const struct sr_caller *c, int want, enum sr_op op, const char *path)
{
	if (want & SR_ACCESS_READ) {
		int r = decide_one(c, SR_ACCESS_READ, op, path);
		if (r)
			return r;
	}
	if (want & SR_ACCESS_WRITE)
		return decide_one(c, SR_ACCESS_WRITE, op, path);
	return 0;
}

static void policy_install(struct policy *p)
{
	pthread_rwlock_wrlock(&policy_lock);
	struct policy *old = policy;
	p->generation = ++policy_generation;
	policy = p;
	pthread_rwlock_unlock(&policy_lock);
	policy_free(old);
}

/* ---- the reader: one request at a time ------------------------------------------ */
static struct sr_session *session;
static char *mount_path;
static int stopping;

static void result(uint32_t seq, int err)
{
	uint8_t b[4];
	put32(b, (uint32_t)(-err));
	enqueue(SR_MSG_RESULT, seq, b, 4, 0);
}

static void send_status(uint32_t seq)
{
	uint8_t b[48];
	memset(b, 0, sizeof(b));
	pthread_rwlock_rdlock(&policy_lock);
	if (policy) {
		b[0] = (uint8_t)policy->mode;
		b[1] = (uint8_t)policy->default_permit;
		put16(b + 2, (uint16_t)policy->nrules);
		put64(b + 8, policy->generation);
	}
	pthread_rwlock_unlock(&policy_lock);
	put32(b + 4, keys_count());
	pthread_mutex_lock(&out_lock);
	put64(b + 16, events_sent);
	put64(b + 24, events_dropped);
	pthread_mutex_unlock(&out_lock);
	put32(b + 32, (uint32_t)getpid());
	put32(b + 36, SR_PROTO_VERSION);
	put64(b + 40, sr_fs_inodes());
	enqueue(SR_MSG_STATUS, seq, b, sizeof(b), 0);
}

/* Unmount from inside: the kernel ends the connection, the request loop sees ENODEV. A
 * busy mount is detached, and its connection aborted so open files lose plaintext now. */
int sr_mount_device(const char *mountpoint, unsigned *maj, unsigned *mnr)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	char line[2 * PATH_MAX];
	int found = 0;
	while (fgets(line, sizeof(line), f)) {
		char where[PATH_MAX];
		unsigned a, b;
		/* id parent maj:min root mountpoint ... (the last match is the one on top) */
		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &a, &b, where) == 3 && !strcmp(where, mountpoint)) {
			*maj = a;
			*mnr = b;
			found = 1;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* Unmount from inside: the kernel ends the connection, the request loop sees ENODEV. A
 * busy mount is detached, and its connection aborted so open files lose plaintext now.
 * Never a stat() of the mount: the loop may already have stopped answering. */
static pthread_mutex_t shutdown_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t shutdown_cond = PTHREAD_COND_INITIALIZER;
static int shutdown_running;

static void unmount_from_inside(void);

/* Before MOUNT the daemon has not mounted: nothing to unmount (the mount point may
 * hold someone else's mount, e.g. a stale one the plane is about to clear). */
static pthread_mutex_t mount_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mount_cond = PTHREAD_COND_INITIALIZER;
static enum { MOUNT_WAITING, MOUNT_GO, MOUNT_GONE } mount_state;
static int mounted;

static void mount_signal(int state)
{
	pthread_mutex_lock(&mount_lock);
	if (mount_state == MOUNT_WAITING)
		mount_state = state;
	pthread_cond_broadcast(&mount_cond);
	pthread_mutex_unlock(&mount_lock);
}

int sr_control_await_mount(void)
{
	if (ctl_fd < 0)
		return 0;
	pthread_mutex_lock(&mount_lock);
	while (mount_state == MOUNT_WAITING)
		pthread_cond_wait(&mount_cond, &mount_lock);
	int go = mount_state == MOUNT_GO;
	pthread_mutex_unlock(&mount_lock);
	return go ? 0 : -1;
}

/* The mount this daemon made: below, at sr_mount_is_own. */
static unsigned own_maj, own_mnr;
static int own_known;

/* The writeback cache holds what applications wrote and the daemon has not seen yet:
 * push it through while the keys are still here, so a stop loses nothing written. Only
 * while the request loop runs (sr_control_stop sets `stopping` after it ended) and only
 * our own mount (never what lies under the path once ours is gone). syncfs(2) alone is
 * not enough: it returns once FUSE has queued the writeback (measured: 23 of 200 one-byte
 * files not yet written when it returned), so we then wait for the connection's count of
 * requests in flight to reach zero (fusectl's `waiting`), 30 s at most. */
static void flush_mount(void)
{
	if (__atomic_load_n(&stopping, __ATOMIC_SEQ_CST) || !session || !mount_path ||
	    !__atomic_load_n(&mounted, __ATOMIC_ACQUIRE) || !own_known || !sr_mount_is_own(mount_path))
		return;
	if (!(sr_session_want(session) & FUSE_WRITEBACK_CACHE))
		return;
	int fd = open(mount_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	(void)syncfs(fd);
	close(fd);
	char path[96];
	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/waiting", own_mnr);
	for (int i = 0; i < 30000; i++) {
		char buf[32];
		int w = open(path, O_RDONLY | O_CLOEXEC);
		if (w < 0)
			return;
		ssize_t n = read(w, buf, sizeof(buf) - 1);
		close(w);
		if (n <= 0)
			return;
		buf[n] = 0;
		if (atoi(buf) == 0)
			return;
		usleep(1000);
	}
	fprintf(stderr, "strongroom-fuse: writeback still in flight after 30 s; stopping anyway\n");
}

static void shut_down(void)
{
	flush_mount();
	sr_keys_wipe();
	mount_signal(MOUNT_GONE);
	if (__atomic_exchange_n(&stopping, 1, __ATOMIC_SEQ_CST))
		return;
	if (!session || !__atomic_load_n(&mounted, __ATOMIC_ACQUIRE))
		return;
	/* The request loop ends as soon as the connection does, and main() must not exit
	 * the process under our feet before the unmount is complete (sr_control_wait). */
	pthread_mutex_lock(&shutdown_lock);
	shutdown_running = 1;
	pthread_mutex_unlock(&shutdown_lock);
	unmount_from_inside();
	pthread_mutex_lock(&shutdown_lock);
	shutdown_running = 0;
	pthread_cond_broadcast(&shutdown_cond);
	pthread_mutex_unlock(&shutdown_lock);
}

void sr_control_wait(void)
{
	pthread_mutex_lock(&shutdown_lock);
	while (shutdown_running)
		pthread_cond_wait(&shutdown_cond, &shutdown_lock);
	pthread_mutex_unlock(&shutdown_lock);
}

/* The device of the mount this daemon made (FUSE: 0:N, one per connection), learnt
 * when it mounted. Only that mount is ever unmounted by path: if someone took it away
 * first (an administrator's umount -l, a restarted agent taking over), the path now
 * shows what lies under it — the guard point's shield, or a newer data plane — and
 * unmounting "whatever is at the path" would remove that. */

int sr_mount_is_own(const char *mountpoint)
{
	unsigned maj, mnr;
	if (!own_known)
		return 1; /* never learnt (not mounted through main): as before */
	return sr_mount_device(mountpoint, &maj, &mnr) == 0 && maj == own_maj && mnr == own_mnr;
}

void sr_abort_own_connection(void)
{
	if (!own_known)
		return;
	char abort_path[96];
	snprintf(abort_path, sizeof(abort_path), "/sys/fs/fuse/connections/%u/abort", own_mnr);
	int fd = open(abort_path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "1", 1);
		close(fd);
	}
}

static void unmount_from_inside(void)
{
	int have_dev = own_known;
	if (have_dev)
		sr_fs_seal(session);
	if (!sr_mount_is_own(mount_path)) {
		/* Our mount is gone from the path already; files opened through it may still
		 * hold the connection: end it, so they lose the plaintext now, and touch
		 * nothing at the path. */
		sr_abort_own_connection();
		return;
	}
	int r = umount2(mount_path, 0) < 0 ? errno : 0;
	if (r == EBUSY) {
		/* MNT_FORCE aborts the FUSE connection (umount_begin) even when the umount
		 * itself still fails; the detach then takes the mount away. The fusectl abort
		 * is the same thing where MNT_FORCE is not allowed. */
		if (umount2(mount_path, MNT_FORCE) < 0)
			(void)umount2(mount_path, MNT_DETACH);
		if (have_dev)
			sr_abort_own_connection();
	} else if (r == EPERM) {
		/* not root: fusermount3 does it */
		pid_t pid = fork();
		if (pid == 0) {
			execlp("fusermount3", "fusermount3", "-u", "-z", mount_path, (char *)NULL);
			_exit(127);
		}
		if (pid > 0)
			(void)waitpid(pid, NULL, 0);
	}
}

void sr_shutdown(void)
{
	shut_down();
}

static int read_full(int fd, uint8_t *b, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = read(fd, b + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

static void *reader_main(void *arg)
{
	(void)arg;
	uint8_t hdr[12];
	uint8_t *payload = NULL;
	while (read_full(ctl_fd, hdr, 4) == 0) {
		uint32_t len = get32(hdr);
		if (len < 8 || len > SR_MAX_FRAME)
			break; /* a broken peer: stop listening (and shut down below) */
		if (read_full(ctl_fd, hdr + 4, 8) < 0)
			break;
		uint16_t version = get16(hdr + 4), type = get16(hdr + 6);
		uint32_t seq = get32(hdr + 8), plen = len - 8;
		payload = malloc(plen ? plen : 1);
		if (!payload || (plen && read_full(ctl_fd, payload, plen) < 0))
			break;
		if (version != SR_PROTO_VERSION) {
			result(seq, -EPROTONOSUPPORT);
		} else if (type == SR_MSG_STATUS_REQ) {
			send_status(seq);
		} else if (type == SR_MSG_SET_POLICY) {
			struct policy *p = policy_parse(payload, plen);
			if (p)
				policy_install(p);
			result(seq, p ? 0 : -EINVAL);
		} else if (type == SR_MSG_SET_KEY) {
			result(seq, plen == 52 ? key_set(payload, get32(payload + 16), payload + 20) : -EINVAL);
		} else if (type == SR_MSG_SET_ACTIVE) {
			result(seq, plen == 20 ? key_activate(payload, get32(payload + 16)) : -EINVAL);
		} else if (type == SR_MSG_REKEY) {
			if (plen == 0 || plen >= PATH_MAX || memchr(payload, 0, plen)) {
				result(seq, -EINVAL);
			} else {
				char rel[PATH_MAX];
				memcpy(rel, payload, plen);
				rel[plen] = '\0';
				result(seq, sr_fs_rekey(rel));
			}
		} else if (type == SR_MSG_MOUNT) {
			pthread_mutex_lock(&mount_lock);
			int first = mount_state == MOUNT_WAITING;
			pthread_mutex_unlock(&mount_lock);
			result(seq, plen ? -EINVAL : first ? 0 : -EALREADY);
			if (!plen && first)
				mount_signal(MOUNT_GO);
		} else if (type == SR_MSG_DROP_KEY) {
			result(seq, plen == 20 ? key_drop(payload, get32(payload + 16)) : -EINVAL);
		} else if (type == SR_MSG_SHUTDOWN) {
			result(seq, 0);
			explicit_bzero(payload, plen);
			free(payload);
			payload = NULL;
			break;
		} else {
			result(seq, -EOPNOTSUPP);
		}
		explicit_bzero(payload, plen); /* SET_KEY carried a key */
		free(payload);
		payload = NULL;
	}
	free(payload);
	shut_down();
	return NULL;
}

int sr_control_start(int fd, struct sr_session *se, const char *mountpoint)
{
	int r = keys_init();
	if (r < 0)
		return r;
	session = se;
	mount_path = strdup(mountpoint);
	if (fd < 0)
		return 0; /* no control plane: policy off, no keys */
	ctl_fd = fd;
	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	/* Fail closed until the plane says otherwise: enforce, no rules, default deny. */
	struct policy *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->mode = SR_MODE_ENFORCE;
	policy_install(p);
	if (pthread_create(&writer_thread, NULL, writer_main, NULL))
		return -EAGAIN;
	if (pthread_create(&reader_thread, NULL, reader_main, NULL))
		return -EAGAIN;
	threads_started = 1;
	return 0;
}

void sr_control_ready(void)
{
	if (mount_path && sr_mount_device(mount_path, &own_maj, &own_mnr) == 0)
		own_known = 1; /* just mounted: the mount on top of the path is ours */
	__atomic_store_n(&mounted, 1, __ATOMIC_RELEASE);
	uint8_t b[8];
	put32(b, (uint32_t)getpid());
	put32(b + 4, SR_PROTO_VERSION);
	enqueue(SR_MSG_READY, 0, b, sizeof(b), 0);
}

/* After the request loop ended: flush what is queued, wipe keys, release everything. */
void sr_control_stop(void)
{
	__atomic_store_n(&stopping, 1, __ATOMIC_SEQ_CST);
	sr_keys_wipe();
	if (threads_started) {
		pthread_mutex_lock(&out_lock);
		out_closing = 1;
		pthread_cond_broadcast(&out_cond);
		pthread_mutex_unlock(&out_lock);
		/* Flush what is queued, for 2 s at most: a plane that stopped reading must not
		 * keep the daemon from exiting (shutdown wakes a blocked send). */
		struct timespec deadline;
		clock_gettime(CLOCK_REALTIME, &deadline);
		deadline.tv_sec += 2;
		if (pthread_timedjoin_np(writer_thread, NULL, &deadline) != 0) {
			shutdown(ctl_fd, SHUT_RDWR);
			pthread_join(writer_thread, NULL);
		}
		shutdown(ctl_fd, SHUT_RDWR); /* wakes the reader if the plane is still there */
		pthread_join(reader_thread, NULL);
		close(ctl_fd);
	}
	if (keys) {
		explicit_bzero(keys, keys_len);
		(void)syscall(SYS_munlock, keys, keys_len);
		munmap(keys, keys_len);
		keys = NULL;
	}
	pthread_rwlock_wrlock(&policy_lock);
	policy_free(policy);
	policy = NULL;
	pthread_rwlock_unlock(&policy_lock);
	free(mount_path);
	mount_path = NULL;
}
