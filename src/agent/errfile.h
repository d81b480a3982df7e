/*
 * errfile.h - the exception message a PyTorch worker leaves in its
 * TORCHELASTIC_ERROR_FILE (written by torch.distributed.elastic's @record),
 * read with jansson. The file reader is agent_error_file_message() in
 * agent.h; the parser alone is here so that it can be tested and fuzzed
 * without files.
 *
 * Thread safety: no shared state.
 */
#ifndef COHORT_AGENT_ERRFILE_H
#define COHORT_AGENT_ERRFILE_H

#include <stddef.h>

/* Error files larger than this are not read (torch writes a few kilobytes). */
#define AGENT_ERRFILE_MAX (1 << 20)

/*
 * Takes the message out of len bytes of an error file: torch writes
 * {"message": {"message": "<Type>: <text>", "extraInfo": {...}}}, older
 * versions {"message": "<text>"}; the innermost "message" string counts.
 * It is copied into out (outlen > 0 bytes, truncated on a UTF-8 character
 * boundary) as one line: line breaks and tabs become spaces, other control
 * characters '?'. Returns 0, or -EPROTO when the bytes are not such a
 * document (out is then the empty string).
 */
int agent_error_json_message(const char *json, size_t len, char *out, size_t outlen);

#endif
