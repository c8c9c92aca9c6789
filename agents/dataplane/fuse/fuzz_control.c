/* libFuzzer harness for the control channel's parsers (`make fuzz`): SET_POLICY tables
 * arrive from another process and must never be read out of bounds, whatever they hold.
 * Built with policy.c alone; the channel is stubbed (no plane connected). */
#include "channel.h"
#include "policy.h"

int sr_channel_connected(void)
{
	return 0;
}

void sr_channel_send(uint16_t type, uint32_t seq, const uint8_t *payload, size_t len, int is_event)
{
	(void)type, (void)seq, (void)payload, (void)len, (void)is_event;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sr_policy *p = sr_policy_parse(data, size);
	if (p) {
		/* decide against a fixed caller with every access, as a request would */
		struct sr_caller c = { .uid = 1000, .gid = 1000, .pid = 1, .ngroups = 2, .groups = { 10, 20 } };
		for (uint32_t i = 0; i < p->nrules; i++)
			(void)sr_rule_matches(&p->rules[i], &c, SR_ACCESS_READ, "/usr/bin/cat");
		/* and through the installed policy, as every request does */
		sr_policy_install(p);
		(void)sr_policy_check(&c, SR_ACCESS_ALL, SR_OP_OPEN, "/f");
		sr_policy_clear();
	}
	return 0;
}
