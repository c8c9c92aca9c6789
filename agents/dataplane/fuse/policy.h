/* The access policy (policy.c): SET_POLICY's table parsed into an immutable policy,
 * swapped whole; the decision per operation and its events are declared in control.h. */
#ifndef SR_POLICY_H
#define SR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "control.h"

struct sr_rule {
	int permit, access, audit;
	uint32_t n_users, n_uids, n_gids, n_exes;
	uint32_t *users, *uids, *gids; /* users: uids the plane resolved from user names */
	char **exes;
};

struct sr_policy {
	int mode, default_permit;
	uint32_t nrules;
	int needs_exe;
	uint64_t generation;
	struct sr_rule *rules;
};

/* A SET_POLICY payload (README.md), or NULL when it is malformed in any way. */
struct sr_policy *sr_policy_parse(const uint8_t *payload, size_t len);
void sr_policy_free(struct sr_policy *p);
/* Whether `r` decides for caller `c` wanting `want` (one of SR_ACCESS_READ/WRITE);
 * `exe` is the caller's executable, "" when unknown. */
int sr_rule_matches(const struct sr_rule *r, const struct sr_caller *c, int want, const char *exe);

/* Make `p` the policy in force (it gets the next generation); the old one is freed. */
void sr_policy_install(struct sr_policy *p);
/* Fail closed until the plane says otherwise: enforce, no rules, default deny. */
int sr_policy_install_closed(void);
/* For STATUS: mode, default, rule count and generation of the policy in force. */
void sr_policy_status(uint8_t *mode, uint8_t *default_permit, uint16_t *nrules, uint64_t *generation);
/* At exit. */
void sr_policy_clear(void);

#endif
