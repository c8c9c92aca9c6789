/* Command-line values shared by strongroom-fuse and strongroom-volume. */
#ifndef SR_ARGS_H
#define SR_ARGS_H

/* A decimal number in 0..INT_MAX, the whole string (no sign, no space, not empty):
 * 0 and *out set, or -1 and *out untouched. */
int sr_parse_int(const char *s, int *out);

#endif
