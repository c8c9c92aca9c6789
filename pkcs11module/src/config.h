/* The module's configuration file: one [slot] section per identity. */
#ifndef SR_CONFIG_H
#define SR_CONFIG_H

#include <stddef.h>

#define CONF_MAX_SLOTS 32
#define CONF_PATH_MAX 1024

typedef struct {
    char label[33];            /* empty: the certificate's CN */
    char host[256];
    char port[8];
    char ca[CONF_PATH_MAX];
    char cert[CONF_PATH_MAX];
    char key[CONF_PATH_MAX];
} slot_conf;

typedef struct {
    int nslots;
    slot_conf slots[CONF_MAX_SLOTS];
} module_conf;

/* Reads `path`. 0 on success; otherwise -1 with a one-line reason in err. */
int conf_load(const char *path, module_conf *c, char *err, size_t errlen);

#endif
