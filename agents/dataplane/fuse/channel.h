/* The control channel's socket (channel.c): the outgoing queue and its writer thread,
 * and whole-frame reads for the reader (control.c). */
#ifndef SR_CHANNEL_H
#define SR_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

/* Take over `fd` and start the writer thread: 0 or -EAGAIN. */
int sr_channel_open(int fd);
/* Whether a control plane is connected (events are worth building). */
int sr_channel_connected(void);
/* Queue one frame; never blocks on the socket. An event (is_event) is dropped, and
 * counted, when EVENT_QUEUE_MAX events wait already or the channel is closing. */
void sr_channel_send(uint16_t type, uint32_t seq, const uint8_t *payload, size_t len, int is_event);
/* Exactly `n` bytes, or -1 at end of file or on an error. */
int sr_channel_read(uint8_t *b, size_t n);
/* Events queued and dropped so far, for STATUS. */
void sr_channel_counts(uint64_t *sent, uint64_t *dropped);
/* Flush what is queued (2 s at most), end the writer; then wake a blocked reader. */
void sr_channel_close_writer(void);
void sr_channel_wake_reader(void);
/* Close the socket (after the reader thread is joined). */
void sr_channel_close(void);

#endif
