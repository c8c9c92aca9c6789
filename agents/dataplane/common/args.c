/* Command-line values shared by the daemons (args.h). */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

int sr_parse_int(const char *s, int *out)
{
	char *end;
	/* strtol takes leading space and a sign: "-0", " 3" and "+3" are not what was meant */
	if (!s || !isdigit((unsigned char)s[0]))
		return -1;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > INT_MAX)
		return -1;
	*out = (int)v;
	return 0;
}
