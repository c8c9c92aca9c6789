/* KMIP over mutual TLS (OpenSSL 3): per-slot context, a small connection pool,
 * reconnect after a server restart, framing with bounded reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "module.h"

#define IO_TIMEOUT_S 60

static const char *ssl_err(void)
{
    static __thread char buf[256];
    unsigned long e = ERR_get_error();
    if (e == 0)
        return "no detail";
    ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    return buf;
}

static int key_is_encrypted(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[256];
    int enc = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "BEGIN ENCRYPTED PRIVATE KEY") || strstr(line, "Proc-Type: 4,ENCRYPTED")) {
            enc = 1;
            break;
        }
    }
    fclose(f);
    return enc;
}

typedef struct {
    const unsigned char *pin;
    size_t len;
} pin_arg;

static int pin_cb(char *buf, int size, int rwflag, void *u)
{
    (void)rwflag;
    const pin_arg *p = u;
    if (p == NULL || p->pin == NULL || p->len > (size_t)size)
        return -1;    /* no passphrase: fail rather than prompt on the terminal */
    memcpy(buf, p->pin, p->len);
    return (int)p->len;
}

/* Builds the TLS context with the key; `pin` NULL for an unencrypted key. */
static CK_RV make_ctx(sr_slot *s, const unsigned char *pin, size_t pinlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return CKR_HOST_MEMORY;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(ctx, s->conf.ca, NULL) != 1) {
        sr_log("slot '%s': ca %s cannot be loaded: %s", s->label, s->conf.ca, ssl_err());
        SSL_CTX_free(ctx);
        return CKR_GENERAL_ERROR;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, s->conf.cert) != 1) {
        sr_log("slot '%s': cert %s cannot be loaded: %s", s->label, s->conf.cert, ssl_err());
        SSL_CTX_free(ctx);
        return CKR_GENERAL_ERROR;
    }
    FILE *f = fopen(s->conf.key, "r");
    if (f == NULL) {
        sr_log("slot '%s': key %s cannot be read: %s", s->label, s->conf.key, strerror(errno));
        SSL_CTX_free(ctx);
        return CKR_GENERAL_ERROR;
    }
    pin_arg pa = { pin, pinlen };
    EVP_PKEY *pk = PEM_read_PrivateKey(f, NULL, pin_cb, &pa);
    fclose(f);
    if (pk == NULL) {
        ERR_clear_error();
        SSL_CTX_free(ctx);
        if (s->login_required)
            return CKR_PIN_INCORRECT;
        sr_log("slot '%s': key %s is not a PEM private key", s->label, s->conf.key);
        return CKR_GENERAL_ERROR;
    }
    if (SSL_CTX_use_PrivateKey(ctx, pk) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        sr_log("slot '%s': key %s does not match cert %s", s->label, s->conf.key, s->conf.cert);
        EVP_PKEY_free(pk);
        SSL_CTX_free(ctx);
        ERR_clear_error();
        return CKR_GENERAL_ERROR;
    }
    EVP_PKEY_free(pk);
    s->ctx = ctx;
    return CKR_OK;
}

CK_RV slot_setup(sr_slot *s)
{
    pthread_mutex_init(&s->lock, NULL);
    s->pool_pid = getpid();
    FILE *f = fopen(s->conf.cert, "r");
    if (f == NULL) {
        sr_log("cert %s cannot be read: %s", s->conf.cert, strerror(errno));
        return CKR_GENERAL_ERROR;
    }
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (x == NULL) {
        sr_log("cert %s is not a PEM certificate", s->conf.cert);
        ERR_clear_error();
        return CKR_GENERAL_ERROR;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    X509_digest(x, EVP_sha256(), md, &mdlen);
    for (int i = 0; i < 8; i++)
        snprintf(s->serial + 2 * i, 3, "%02x", md[i]);
    if (s->conf.label[0]) {
        snprintf(s->label, sizeof(s->label), "%s", s->conf.label);
    } else {
        char cn[256] = "";
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
        const char *src = cn[0] ? cn : "strongroom";
        size_t l = strnlen(src, sizeof(s->label) - 1);   /* a token label is 32 bytes */
        memcpy(s->label, src, l);
        s->label[l] = '\0';
    }
    X509_free(x);
    int enc = key_is_encrypted(s->conf.key);
    if (enc < 0) {
        sr_log("key %s cannot be read: %s", s->conf.key, strerror(errno));
        return CKR_GENERAL_ERROR;
    }
    s->login_required = enc;
    if (!enc)
        return make_ctx(s, NULL, 0);
    return CKR_OK;
}

CK_RV slot_login(sr_slot *s, const unsigned char *pin, size_t pinlen)
{
    pthread_mutex_lock(&s->lock);
    CK_RV rv = CKR_OK;
    if (!s->login_required) {
        s->logged_in = 1;
    } else if (s->logged_in) {
        rv = CKR_USER_ALREADY_LOGGED_IN;
    } else {
        if (pin == NULL)
            rv = CKR_PIN_INCORRECT;
        else
            rv = make_ctx(s, pin, pinlen);
        if (rv == CKR_OK)
            s->logged_in = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return rv;
}

static void pool_drain(sr_slot *s)
{
    for (int i = 0; i < s->npool; i++) {
        int fd = SSL_get_fd(s->pool[i]);
        SSL_free(s->pool[i]);
        if (fd >= 0)
            close(fd);
    }
    s->npool = 0;
}

void slot_logout(sr_slot *s)
{
    pthread_mutex_lock(&s->lock);
    s->logged_in = 0;
    if (s->login_required) {
        pool_drain(s);
        SSL_CTX_free(s->ctx);
        s->ctx = NULL;
    }
    pthread_mutex_unlock(&s->lock);
}

void slot_teardown(sr_slot *s)
{
    pthread_mutex_lock(&s->lock);
    pool_drain(s);
    SSL_CTX_free(s->ctx);
    s->ctx = NULL;
    s->logged_in = 0;
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
}

static void ssl_close(SSL *ssl)
{
    int fd = SSL_get_fd(ssl);
    SSL_free(ssl);
    if (fd >= 0)
        close(fd);
}

static CK_RV connect_new(sr_slot *s, SSL_CTX *ctx, SSL **out)
{
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(s->conf.host, s->conf.port, &hints, &res);
    if (gai != 0) {
        sr_log("slot '%s': server %s cannot be resolved (%s): check 'server =' in the "
               "configuration and DNS", s->label, s->conf.host, gai_strerror(gai));
        return CKR_DEVICE_ERROR;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct timeval tv = { IO_TIMEOUT_S, 0 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        struct timeval ctv = { 10, 0 };
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &ctv, sizeof(ctv));
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
            break;
        }
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        sr_log("slot '%s': KMIP server %s:%s is unreachable (%s): check that the Strongroom "
               "server runs and its KMIP port is open", s->label, s->conf.host, s->conf.port,
               strerror(err));
        return CKR_DEVICE_ERROR;
    }
    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL) {
        close(fd);
        return CKR_HOST_MEMORY;
    }
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, s->conf.host);
    SSL_set1_host(ssl, s->conf.host);
    if (SSL_connect(ssl) != 1) {
        long vr = SSL_get_verify_result(ssl);
        if (vr != X509_V_OK)
            sr_log("slot '%s': the KMIP server %s:%s failed verification (%s): check 'ca =' "
                   "and that the server certificate names '%s'", s->label, s->conf.host,
                   s->conf.port, X509_verify_cert_error_string(vr), s->conf.host);
        else
            sr_log("slot '%s': TLS with %s:%s failed (%s): check that the client certificate "
                   "is issued by Strongroom and not revoked", s->label, s->conf.host,
                   s->conf.port, ssl_err());
        ssl_close(ssl);
        return CKR_DEVICE_ERROR;
    }
    *out = ssl;
    return CKR_OK;
}

static int write_all(SSL *ssl, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t w = 0;
        if (SSL_write_ex(ssl, p, n, &w) != 1)
            return -1;
        p += w;
        n -= w;
    }
    return 0;
}

static int read_all(SSL *ssl, uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t r = 0;
        if (SSL_read_ex(ssl, p, n, &r) != 1)
            return -1;
        p += r;
        n -= r;
    }
    return 0;
}

/* 0 ok; -1 failed before anything came back (retryable on a reused connection);
 * -2 a malformed or oversized answer. */
static int exchange(SSL *ssl, const tbuf *req, uint8_t **resp, size_t *resp_len)
{
    uint8_t hdr[8];
    if (write_all(ssl, req->p, req->len) || read_all(ssl, hdr, 8))
        return -1;
    uint32_t tag = ((uint32_t)hdr[0] << 16) | ((uint32_t)hdr[1] << 8) | hdr[2];
    uint32_t len = ((uint32_t)hdr[4] << 24) | ((uint32_t)hdr[5] << 16) | ((uint32_t)hdr[6] << 8) | hdr[7];
    if (tag != T_RESPONSE_MESSAGE || hdr[3] != TTLV_STRUCT || len % 8 != 0
        || len > 2 * KMIP_MAX_MESSAGE)
        return -2;
    uint8_t *buf = malloc((size_t)len + 8);
    if (buf == NULL)
        return -2;
    memcpy(buf, hdr, 8);
    if (read_all(ssl, buf + 8, len)) {
        free(buf);
        return -2;
    }
    *resp = buf;
    *resp_len = (size_t)len + 8;
    return 0;
}

CK_RV kmip_call(sr_slot *s, int n, const uint32_t *ops, const tbuf *payloads, kresponse *out)
{
    tbuf req;
    tb_init(&req);
    kmip_request(&req, n, ops, payloads);
    if (req.err) {
        tb_free(&req);
        return CKR_HOST_MEMORY;
    }
    if (req.len > KMIP_MAX_MESSAGE) {
        tb_free(&req);
        return CKR_DATA_LEN_RANGE;
    }
    CK_RV rv = CKR_DEVICE_ERROR;
    for (int attempt = 0; attempt < 2; attempt++) {
        SSL *ssl = NULL;
        int reused = 0;
        pthread_mutex_lock(&s->lock);
        SSL_CTX *ctx = s->ctx;
        if (ctx == NULL) {
            pthread_mutex_unlock(&s->lock);
            rv = CKR_USER_NOT_LOGGED_IN;
            break;
        }
        if (s->pool_pid != getpid()) {
            /* a forked child: the pooled TLS sessions are the parent's; using one would
             * interleave two processes' records on one stream. Drop them without a
             * close_notify (closing our copy of the socket leaves the parent's open). */
            for (int i = 0; i < s->npool; i++) {
                int fd = SSL_get_fd(s->pool[i]);
                SSL_set_quiet_shutdown(s->pool[i], 1);
                SSL_free(s->pool[i]);
                if (fd >= 0)
                    close(fd);
            }
            s->npool = 0;
            s->pool_pid = getpid();
        }
        if (s->npool > 0) {
            ssl = s->pool[--s->npool];
            reused = 1;
        } else {
            SSL_CTX_up_ref(ctx);
        }
        pthread_mutex_unlock(&s->lock);
        if (ssl == NULL) {
            rv = connect_new(s, ctx, &ssl);
            SSL_CTX_free(ctx);
            if (rv != CKR_OK)
                break;
        }
        uint8_t *resp = NULL;
        size_t resp_len = 0;
        int x = exchange(ssl, &req, &resp, &resp_len);
        if (x != 0) {
            ERR_clear_error();
            ssl_close(ssl);
            if (x == -1 && reused)
                continue;    /* the server closed an idle connection (restart): once more */
            sr_log("slot '%s': the KMIP exchange with %s:%s failed%s: check the server's log",
                   s->label, s->conf.host, s->conf.port,
                   x == -2 ? " (malformed or oversized answer)" : " (connection lost)");
            rv = CKR_DEVICE_ERROR;
            break;
        }
        if (kmip_parse_response(out, resp, resp_len) != 0) {
            OPENSSL_cleanse(resp, resp_len);
            free(resp);
            ssl_close(ssl);
            sr_log("slot '%s': undecodable KMIP response from %s:%s", s->label, s->conf.host,
                   s->conf.port);
            rv = CKR_DEVICE_ERROR;
            break;
        }
        out->owned = resp;
        out->owned_len = resp_len;
        pthread_mutex_lock(&s->lock);
        if (s->ctx == SSL_get_SSL_CTX(ssl) && s->npool < POOL_MAX) {
            s->pool[s->npool++] = ssl;
            ssl = NULL;
        }
        pthread_mutex_unlock(&s->lock);
        if (ssl != NULL)
            ssl_close(ssl);
        rv = CKR_OK;
        break;
    }
    tb_free(&req);
    return rv;
}

CK_RV kmip_one(sr_slot *s, uint32_t op, const tbuf *payload, kresponse *out, int for_key_use)
{
    CK_RV rv = kmip_call(s, 1, &op, payload, out);
    if (rv != CKR_OK)
        return rv;
    kitem *it = &out->items[0];
    if (it->status != 0 || it->payload < 0) {
        if (it->status == 0)
            return CKR_OK;   /* callers check the payload they need */
        if (getenv("STRONGROOM_PKCS11_DEBUG") != NULL)
            sr_log("slot '%s': KMIP operation %u refused: %s: %.*s", s->label, (unsigned)op,
                   kmip_reason_name(it->reason),
                   (int)(it->message_len > 300 ? 300 : it->message_len),
                   it->message ? (const char *)it->message : "");
        else if (it->reason == REASON_GENERAL_FAILURE || it->reason == 0)
            sr_log("slot '%s': the server answered General Failure: %.*s", s->label,
                   (int)(it->message_len > 300 ? 300 : it->message_len),
                   it->message ? (const char *)it->message : "");
        rv = kmip_reason_to_ckr(it->reason, for_key_use);
        kresponse_free(out);
        return rv;
    }
    return CKR_OK;
}
