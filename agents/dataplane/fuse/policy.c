/* The access policy: immutable tables, swapped whole under a write lock; the decision
 * per operation; the events it queues for the audit log. Wire format: README.md. */
#define _GNU_SOURCE
#include "policy.h"

#include "channel.h"
#include "wire.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_rwlock_t policy_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct sr_policy *policy; /* NULL = mode off */
static uint64_t policy_generation;

void sr_policy_free(struct sr_policy *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->nrules; i++) {
		struct sr_rule *r = &p->rules[i];
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

static uint32_t *parse_ids(struct sr_rd *r, uint32_t *n)
{
	*n = sr_rd16(r);
	uint32_t *ids = calloc(*n ? *n : 1, sizeof(uint32_t));
	if (!ids) {
		r->bad = 1;
		return NULL;
	}
	for (uint32_t i = 0; i < *n; i++)
		ids[i] = sr_rd32(r);
	return ids;
}

struct sr_policy *sr_policy_parse(const uint8_t *payload, size_t len)
{
	struct sr_rd r = { payload, len, 0 };
	struct sr_policy *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->mode = (int)sr_rd8(&r);
	p->default_permit = (int)sr_rd8(&r);
	p->nrules = sr_rd16(&r);
	if (r.bad || p->mode > SR_MODE_LEARN || p->default_permit > 1) {
		free(p);
		return NULL;
	}
	p->rules = calloc(p->nrules ? p->nrules : 1, sizeof(struct sr_rule));
	if (!p->rules) {
		free(p);
		return NULL;
	}
	uint32_t parsed = 0;
	for (; parsed < p->nrules && !r.bad; parsed++) {
		struct sr_rule *ru = &p->rules[parsed];
		ru->permit = (int)sr_rd8(&r);
		ru->access = (int)sr_rd8(&r);
		ru->audit = (int)sr_rd8(&r);
		(void)sr_rd8(&r);
		if (ru->permit > 1 || ru->access < 1 || ru->access > 3 || ru->audit > 1)
			r.bad = 1;
		ru->users = parse_ids(&r, &ru->n_users);
		ru->uids = parse_ids(&r, &ru->n_uids);
		ru->gids = parse_ids(&r, &ru->n_gids);
		ru->n_exes = sr_rd16(&r);
		ru->exes = calloc(ru->n_exes ? ru->n_exes : 1, sizeof(char *));
		if (!ru->exes) {
			r.bad = 1;
			ru->n_exes = 0;
		}
		for (uint32_t j = 0; j < ru->n_exes; j++) {
			uint32_t l = sr_rd16(&r);
			const uint8_t *s = sr_take(&r, l);
			ru->exes[j] = s ? strndup((const char *)s, l) : NULL;
			if (!ru->exes[j] || strlen(ru->exes[j]) != l)
				r.bad = 1;
		}
		if (ru->n_exes)
			p->needs_exe = 1;
	}
	p->nrules = parsed; /* what sr_policy_free must release */
	if (r.bad || r.left) {
		sr_policy_free(p);
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

static int caller_in_groups(const struct sr_caller *c, const struct sr_rule *r)
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

int sr_rule_matches(const struct sr_rule *r, const struct sr_caller *c, int want, const char *exe)
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
	if (!sr_channel_connected())
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
	sr_put32(b + 4, (uint32_t)c->uid);
	sr_put32(b + 8, (uint32_t)c->gid);
	sr_put32(b + 12, (uint32_t)c->pid);
	sr_put32(b + 16, (uint32_t)rule);
	sr_put32(b + 20, 0);
	sr_put16(b + 24, (uint16_t)pl);
	if (pl)
		memcpy(b + 26, path, pl);
	sr_put16(b + 26 + pl, (uint16_t)el);
	memcpy(b + 28 + pl, exe, el);
	sr_channel_send(SR_MSG_EVENT, 0, b, 28 + pl + el, 1);
	free(b);
}

static int decide_one(const struct sr_caller *c, int want, enum sr_op op, const char *path)
{
	char exe[PATH_MAX] = "";
	int allowed, would, audit, rule = -1;
	pthread_rwlock_rdlock(&policy_lock);
	struct sr_policy *p = policy;
	if (!p || p->mode == SR_MODE_OFF) {
		pthread_rwlock_unlock(&policy_lock);
		return 0;
	}
	if (p->needs_exe)
		caller_exe(c->pid, exe, sizeof(exe));
	would = p->default_permit;
	audit = !would;
	for (uint32_t i = 0; i < p->nrules; i++) {
		if (sr_rule_matches(&p->rules[i], c, want, exe)) {
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

void sr_policy_install(struct sr_policy *p)
{
	pthread_rwlock_wrlock(&policy_lock);
	struct sr_policy *old = policy;
	p->generation = ++policy_generation;
	policy = p;
	pthread_rwlock_unlock(&policy_lock);
	sr_policy_free(old);
}

int sr_policy_install_closed(void)
{
	struct sr_policy *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->mode = SR_MODE_ENFORCE;
	sr_policy_install(p);
	return 0;
}

void sr_policy_status(uint8_t *mode, uint8_t *default_permit, uint16_t *nrules, uint64_t *generation)
{
	*mode = *default_permit = 0;
	*nrules = 0;
	*generation = 0;
	pthread_rwlock_rdlock(&policy_lock);
	if (policy) {
		*mode = (uint8_t)policy->mode;
		*default_permit = (uint8_t)policy->default_permit;
		*nrules = (uint16_t)policy->nrules;
		*generation = policy->generation;
	}
	pthread_rwlock_unlock(&policy_lock);
}

void sr_policy_clear(void)
{
	pthread_rwlock_wrlock(&policy_lock);
	sr_policy_free(policy);
	policy = NULL;
	pthread_rwlock_unlock(&policy_lock);
}
