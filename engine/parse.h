/* mloop — parsing the values of options every front end shares.
 *
 * Apart from the rest of the engine (libc only), so the mloop command,
 * which does no IO of its own, reads sizes exactly as the servers do.
 */
#ifndef MLOOP_PARSE_H
#define MLOOP_PARSE_H

#include <stdint.h>

/* Parses a size in bytes: digits with an optional K, M, G or T suffix
 * (binary units, either case).  Returns 0 and sets *OUT, or -EINVAL
 * (not a size) or -ERANGE (over 2^64 - 1).  Every front end's size
 * options go through it.
 */
int mloop_size_parse (const char *str, uint64_t *out);

#endif /* MLOOP_PARSE_H */
