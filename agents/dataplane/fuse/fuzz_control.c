/* libFuzzer harness for the control channel's parsers (`make fuzz`): SET_POLICY tables
 * arrive from another process and must never be read out of bounds, whatever they hold.
 * Built with control.c included, so the parser's static functions are reachable. */
#include "control.c"

uint64_t sr_fs_inodes(void)
{
	return 0;
}

void sr_fs_seal(struct sr_session *se)
{
	(void)se;
}

uint64_t sr_session_want(const struct sr_session *se)
{
	(void)se;
	return 0;
}

int sr_fs_rekey(const char *rel)
{
	(void)rel;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct policy *p = policy_parse(data, size);
	if (p) {
		/* decide against a fixed caller with every access, as a request would */
		struct sr_caller c = { .uid = 1000, .gid = 1000, .pid = 1, .ngroups = 2, .groups = { 10, 20 } };
		for (uint32_t i = 0; i < p->nrules; i++)
			(void)rule_matches(&p->rules[i], &c, SR_ACCESS_READ, "/usr/bin/cat");
		policy_free(p);
	}
	return 0;
}
