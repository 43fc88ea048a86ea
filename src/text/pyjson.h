/* pyjson.h: JSON values written the way Python writes them, so that text
 * built from JSON matches transformers and vLLM byte for byte:
 * json.dumps(x, ensure_ascii=False) (", " and ": " separators, key order
 * kept, floats as repr()) and str(x) for scalars (True, None, 1e+16). */
#ifndef Q35_PYJSON_H
#define Q35_PYJSON_H

#include "base/utf8.h"

#include <jansson.h>

/* repr() of a double: the shortest digits that read back to the same value,
 * in fixed notation for 1e-4 <= |x| < 1e16 and exponent notation otherwise. */
void q35_py_float_repr(double x, q35_buf *out);
/* json.dumps(v, ensure_ascii=False). */
void q35_py_json_dumps(const json_t *v, q35_buf *out);
/* str(v) for a string (its text), number, true/false (True/False) or null
 * (None). Returns false for objects and arrays. */
bool q35_py_str(const json_t *v, q35_buf *out);

#endif
