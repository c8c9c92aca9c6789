/* INI-like configuration: [slot] sections of key = value lines; '#' and ';' start
 * comments (whole-line or after whitespace); unknown keys are errors, so that a typo
 * is reported rather than silently ignored. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int set(char *dst, size_t cap, const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(dst, v, n + 1);
    return 0;
}

static int check_slot(const char *path, int idx, slot_conf *s, char *err, size_t errlen)
{
    const char *missing = !s->host[0] ? "server" : !s->ca[0] ? "ca" : !s->cert[0] ? "cert"
                          : !s->key[0] ? "key" : NULL;
    if (missing) {
        snprintf(err, errlen, "%s: [slot] #%d has no '%s ='", path, idx + 1, missing);
        return -1;
    }
    return 0;
}

int conf_load(const char *path, module_conf *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot be read (%s); set STRONGROOM_PKCS11_CONF to the "
                 "module's configuration file", path, strerror(errno));
        return -1;
    }
    char line[2048];
    int lineno = 0;
    slot_conf *cur = NULL;
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            snprintf(err, errlen, "%s:%d: line too long", path, lineno);
            goto fail;
        }
        /* comments: a line starting with # or ;, or " #" / " ;" after a value */
        for (char *p = line; *p; p++) {
            if ((*p == '#' || *p == ';') && (p == line || isspace((unsigned char)p[-1]))) {
                *p = '\0';
                break;
            }
        }
        char *s = trim(line);
        if (*s == '\0')
            continue;
        if (*s == '[') {
            if (strcmp(s, "[slot]") != 0) {
                snprintf(err, errlen, "%s:%d: unknown section %s (only [slot])", path, lineno, s);
                goto fail;
            }
            if (cur != NULL && check_slot(path, c->nslots - 1, cur, err, errlen))
                goto fail;
            if (c->nslots >= CONF_MAX_SLOTS) {
                snprintf(err, errlen, "%s:%d: more than %d slots", path, lineno, CONF_MAX_SLOTS);
                goto fail;
            }
            cur = &c->slots[c->nslots++];
            continue;
        }
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
            goto fail;
        }
        *eq = '\0';
        char *k = trim(s), *v = trim(eq + 1);
        if (cur == NULL) {
            snprintf(err, errlen, "%s:%d: '%s' outside a [slot] section", path, lineno, k);
            goto fail;
        }
        int bad;
        if (strcmp(k, "label") == 0) {
            bad = set(cur->label, sizeof(cur->label), v);
            if (bad) {
                snprintf(err, errlen, "%s:%d: label must be 1 to 32 characters", path, lineno);
                goto fail;
            }
        } else if (strcmp(k, "server") == 0) {
            const char *port = "5696";
            if (*v == '[') {            /* [v6 address]:port */
                char *rb = strchr(v, ']');
                if (rb != NULL) {
                    *rb = '\0';
                    if (rb[1] == ':')
                        port = rb + 2;
                    else if (rb[1] != '\0')
                        rb = NULL;
                }
                v++;
                if (rb == NULL) {
                    snprintf(err, errlen, "%s:%d: server must be host[:port]", path, lineno);
                    goto fail;
                }
            } else {
                char *colon = strchr(v, ':');
                if (colon != NULL) {
                    *colon = '\0';
                    port = colon + 1;
                }
            }
            bad = set(cur->host, sizeof(cur->host), v) || set(cur->port, sizeof(cur->port), port);
            for (const char *p = cur->port; !bad && *p; p++)
                bad = !isdigit((unsigned char)*p);
            if (bad) {
                snprintf(err, errlen, "%s:%d: server must be host[:port]", path, lineno);
                goto fail;
            }
        } else if (strcmp(k, "ca") == 0 || strcmp(k, "cert") == 0 || strcmp(k, "key") == 0) {
            char *dst = k[0] == 'c' ? (k[1] == 'a' ? cur->ca : cur->cert) : cur->key;
            if (set(dst, CONF_PATH_MAX, v)) {
                snprintf(err, errlen, "%s:%d: %s needs a path", path, lineno, k);
                goto fail;
            }
        } else {
            snprintf(err, errlen, "%s:%d: unknown key '%s' (label, server, ca, cert, key)",
                     path, lineno, k);
            goto fail;
        }
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    if (cur != NULL && check_slot(path, c->nslots - 1, cur, err, errlen))
        return -1;
    if (c->nslots == 0) {
        snprintf(err, errlen, "%s: no [slot] section", path);
        return -1;
    }
    return 0;
fail:
    fclose(f);
    return -1;
}
