/*
 * torchscope.trace._fastscan: a batch of Kineto events, JSON text straight into columns.
 *
 * Why: turning events into columns through msgspec structs and numpy.fromiter costs a Python object per
 * event and ~100 ns per value; this scanner reads the text once and writes each declared field into a
 * growable C array, interning strings through the caller's interner only the first time a given text is
 * seen (a C hash table keeps text -> id after that).
 *
 * Contract: `Scanner.scan(text)` accepts a JSON array of event objects (`scan(text, start, end)`: the
 * comma-separated events of text[start:end], an array's items without its brackets) only when every event has exactly
 * the strict shape the msgspec path decodes without coercion (strings where strings are declared,
 * integers in range where integers are, no duplicate declared keys, no escapes in keys, valid UTF-8 and
 * JSON everywhere). It is deliberately stricter than JSON decoders: anything else returns None and the
 * caller decodes the batch with msgspec, which also decides whether the text is JSON at all. So what
 * this scanner accepts, it decodes exactly as the msgspec path would (numbers are rounded correctly).
 *
 * Fields are declared by the caller (fastscan.FIELDS): (key, in_args, type, default, default_key), where
 * default_key is the interner key of an absent string field (interned once, in __init__).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__GLIBC__) || defined(__APPLE__)
#include <locale.h>
#ifdef __APPLE__
#include <xlocale.h>
#endif
#define HAVE_STRTOD_L 1
static locale_t c_locale; /* strtod_l in the "C" locale: correctly rounded, needs no GIL */
#endif
#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* Bump when the field spec, the types or the output layout change: fastscan.py ignores a module built
 * from another version (a stale in-place build) and parses with msgspec instead. */
#define SPEC_VERSION 3

enum { T_F8 = 0, T_F4, T_I8, T_I4, T_STR, T_RAW, T_KEY, T_FLOW, T_ARGS };
enum { TAG_STR = 1, TAG_INT = 2, TAG_RAW = 3 };

#define MAX_FIELDS 64
#define KEY_BUCKETS 128 /* declared keys by a hash of length and three bytes: one or two compares a key */
#define BUCKET_SLOTS 4
#define MAX_DEPTH 256
#define OK 1
#define BAIL 0
#define ERR (-1)

typedef struct {
    char *key;
    Py_ssize_t key_len;
    int type;
    int in_args;
    double fdefault;
    int64_t idefault;
    int32_t default_id; /* T_STR/T_RAW/T_KEY: the interner id of the absent value */
    char *data; /* output column */
    int width;
} Field;

typedef struct {
    uint64_t hash;
    char *bytes;
    Py_ssize_t len;
    int tag;
    int32_t id;       /* the interner's id; -1 until resolved */
    int32_t pending;  /* index in the current scan's pending list, valid when epoch matches */
    uint32_t epoch;
} Entry;

/* A text first seen during the current scan: turned into a Python key and interned after the scan,
 * when the GIL is held again. */
typedef struct {
    uint64_t hash;
    const char *bytes; /* the entry's own copy */
    Py_ssize_t len;
    int tag;
    int escaped;
    int64_t ival;
} Pending;

typedef struct {
    PyObject_HEAD PyObject *interner;
    Field fields[MAX_FIELDS];
    int nfields;
    int8_t buckets[2][KEY_BUCKETS][BUCKET_SLOTS]; /* [0]: the event's own keys, [1]: its args; -1 = empty */
    int overflow[2][MAX_FIELDS]; /* keys whose bucket was full (none with torchscope's schema) */
    int noverflow[2];
    Entry *table;
    size_t tcap, tcount;
    size_t rows_cap;
    char *scratch;
    size_t scratch_cap;
    int lenient; /* the event being read took a value the way msgspec's lenient path would */
    int risky;   /* ... and has an undeclared top-level value that path might fail to decode (e.g. 1e400) */
    int ph_field; /* index of the `ph` field, -1 if not declared */
    Pending *pending;
    int32_t *resolved; /* interner id of each pending text */
    size_t npending, pending_cap;
    uint32_t epoch;
    PyThreadState *released; /* set while the scan runs without the GIL */
    int nomem; /* an allocation failed without the GIL: raise MemoryError once it is held */
    int busy;
    int ready; /* __init__ succeeded */
} Scanner;

static int out_of_memory(Scanner *s) {
    s->nomem = 1;
    return ERR;
}

/* ---------------------------------------------------------------- JSON lexing */

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), 0 when invalid (overlong, surrogate,
 * beyond U+10FFFF, truncated). */
static inline int utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return (end - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;
        if (c == 0xED && p[1] > 0x9F) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] > 0x8F) return 0;
        return 4;
    }
    return 0;
}

/* The UTF-16 code unit of the escape `\uXXXX` at q, -1 when q does not hold one. */
static inline int escaped_code_unit(const unsigned char *q, const unsigned char *e) {
    if (e - q < 6 || q[0] != '\\' || q[1] != 'u') return -1;
    int cp = 0;
    for (int i = 2; i < 6; i++) {
        int h = hexval(q[i]);
        if (h < 0) return -1;
        cp = cp << 4 | h;
    }
    return cp;
}

/* The high bit of each zero byte of w is set (a few false positives above a zero byte: only a hint). */
static inline uint64_t has_zero_byte(uint64_t w) { return (w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL; }

/* p at the opening quote; returns the pointer after the closing quote, NULL when invalid. */
static const char *scan_string(const char *p, const char *end, int *escaped) {
    const unsigned char *q = (const unsigned char *)p + 1;
    const unsigned char *e = (const unsigned char *)end;
    *escaped = 0;
    while (q < e) {
#ifdef HAVE_SSE2
        /* sixteen bytes at a time to the next quote, backslash, control character or non-ASCII byte
         * (signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them too) */
        while (e - q >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)q);
            __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                        _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                                           _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
            int mask = _mm_movemask_epi8(special);
            if (mask) {
                q += __builtin_ctz((unsigned)mask);
                break;
            }
            q += 16;
        }
#endif
        /* eight plain ASCII bytes at a time: no quote, backslash, control character or UTF-8 lead */
        while (e - q >= 8) {
            uint64_t w;
            memcpy(&w, q, 8);
            uint64_t special = (has_zero_byte(w ^ 0x2222222222222222ULL) | has_zero_byte(w ^ 0x5C5C5C5C5C5C5C5CULL) |
                                ((w - 0x2020202020202020ULL) & ~w) | w) &
                               0x8080808080808080ULL;
            if (special) break;
            q += 8;
        }
        if (q >= e) break;
        unsigned char c = *q;
        if (c == '"') return (const char *)(q + 1);
        if (c == '\\') {
            *escaped = 1;
            if (q + 1 >= e) return NULL;
            c = q[1];
            if (c == 'u') {
                int cp = escaped_code_unit(q, e);
                if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return NULL; /* msgspec rejects a lone surrogate */
                q += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate must be followed by a low one */
                    int low = escaped_code_unit(q, e);
                    if (low < 0xDC00 || low > 0xDFFF) return NULL;
                    q += 6;
                }
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                       c == 't') {
                q += 2;
            } else {
                return NULL;
            }
            continue;
        }
        if (c < 0x20) return NULL;
        if (c < 0x80) {
            q++;
            continue;
        }
        int n = utf8_sequence(q, e);
        if (n == 0) return NULL;
        q += n;
    }
    return NULL;
}

typedef struct {
    int is_int;    /* no fraction, no exponent */
    int int_ok;    /* is_int and fits int64 (at most 18 digits) */
    int64_t ival;
    int double_ok; /* dval holds the correctly rounded value */
    double dval;
} Number;

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Strict JSON number grammar. `need_double` asks for dval (slow path through Python's correctly rounded
 * string-to-double when the exact fast path does not apply). */
static const char *scan_number(Scanner *s, const char *p, const char *end, Number *out, int need_double) {
    const char *start = p;
    int negative = 0, digits = 0, inexact = 0, frac = 0;
    long exp10 = 0;
    uint64_t mant = 0;
    out->is_int = 1;
    out->int_ok = 0;
    out->double_ok = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end) return NULL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && is_digit(*p)) {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                inexact = 1;
            }
            p++;
        }
    } else {
        return NULL;
    }
    if (p < end && *p == '.') {
        out->is_int = 0;
        p++;
        if (p >= end || !is_digit(*p)) return NULL;
        while (p < end && is_digit(*p)) {
            int d = *p - '0';
            if (mant == 0 && d == 0) {
                frac++; /* leading zeros of the fraction are not significant digits */
            } else if (digits < 19) {
                mant = mant * 10 + (uint64_t)d;
                digits++;
                frac++;
            } else {
                inexact = 1;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exp_negative = 0;
        long e = 0;
        out->is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            exp_negative = *p == '-';
            p++;
        }
        if (p >= end || !is_digit(*p)) return NULL;
        while (p < end && is_digit(*p)) {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        exp10 = exp_negative ? -e : e;
    }
    if (out->is_int && !inexact && digits <= 18) {
        out->int_ok = 1;
        out->ival = negative ? -(int64_t)mant : (int64_t)mant;
    }
    if (!need_double) return p;
    exp10 -= frac;
    if (!inexact && mant <= (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        /* Exact operands, one IEEE operation: correctly rounded (Clinger's fast path). */
        double d = (double)mant;
        d = exp10 < 0 ? d / POW10[-exp10] : d * POW10[exp10];
        out->dval = negative ? -d : d;
        out->double_ok = 1;
        return p;
    }
    size_t len = (size_t)(p - start);
    if (len + 1 > s->scratch_cap) {
        char *grown = PyMem_RawRealloc(s->scratch, len + 1);
        if (grown == NULL) return p; /* double_ok stays 0: the caller bails */
        s->scratch = grown;
        s->scratch_cap = len + 1;
    }
    memcpy(s->scratch, start, len);
    s->scratch[len] = '\0';
    char *stop = NULL;
#ifdef HAVE_STRTOD_L
    double d = strtod_l(s->scratch, &stop, c_locale); /* the grammar was checked above */
#else
    if (s->released != NULL) PyEval_RestoreThread(s->released);
    double d = PyOS_string_to_double(s->scratch, &stop, NULL);
    int failed = d == -1.0 && PyErr_Occurred();
    if (failed) PyErr_Clear();
    if (s->released != NULL) s->released = PyEval_SaveThread();
    if (failed) return p;
#endif
    if (stop == s->scratch + len && isfinite(d)) {
        out->dval = d;
        out->double_ok = 1;
    }
    return p;
}

/* Any JSON value; returns the pointer after it, NULL when invalid or nested deeper than MAX_DEPTH. */
static const char *skip_value(Scanner *s, const char *p, const char *end) {
    char closers[MAX_DEPTH];
    int depth = 0, escaped;
    Number number;
    for (;;) {
        /* one value */
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        char c = *p;
        if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH) return NULL;
            closers[depth++] = c == '{' ? '}' : ']';
            p = skip_ws(p + 1, end);
            if (p < end && *p == closers[depth - 1]) {
                p++;
                depth--;
            } else {
                if (c == '{') {
                    if (p >= end || *p != '"' || (p = scan_string(p, end, &escaped)) == NULL) return NULL;
                    p = skip_ws(p, end);
                    if (p >= end || *p != ':') return NULL;
                    p++;
                }
                continue;
            }
        } else if (c == '"') {
            if ((p = scan_string(p, end, &escaped)) == NULL) return NULL;
        } else if (c == '-' || is_digit(c)) {
            if ((p = scan_number(s, p, end, &number, 0)) == NULL) return NULL;
        } else if (end - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0)) {
            p += 4;
        } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
            p += 5;
        } else {
            return NULL;
        }
        /* after a value: close containers, or move to the next member */
        for (;;) {
            if (depth == 0) return p;
            p = skip_ws(p, end);
            if (p >= end) return NULL;
            if (*p == closers[depth - 1]) {
                p++;
                depth--;
                continue;
            }
            if (*p != ',') return NULL;
            p++;
            if (closers[depth - 1] == '}') {
                p = skip_ws(p, end);
                if (p >= end || *p != '"' || (p = scan_string(p, end, &escaped)) == NULL) return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p++;
            }
            break;
        }
    }
}

/* ---------------------------------------------------------------- interning */

static inline uint64_t hash_bytes(int tag, const char *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)tag << 56) ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t w = 0;
        memcpy(&w, p, (size_t)n);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    }
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 32);
}

static int grow_table(Scanner *s) {
    size_t cap = s->tcap ? s->tcap * 2 : 1024;
    Entry *table = PyMem_RawCalloc(cap, sizeof(Entry));
    if (table == NULL) return out_of_memory(s);
    for (size_t i = 0; i < s->tcap; i++) {
        Entry *old = &s->table[i];
        if (old->bytes == NULL) continue;
        size_t j = old->hash & (cap - 1);
        while (table[j].bytes != NULL) j = (j + 1) & (cap - 1);
        table[j] = *old;
    }
    PyMem_RawFree(s->table);
    s->table = table;
    s->tcap = cap;
    return OK;
}

/* JSON string content (between the quotes) as a str; NULL with no exception set when it cannot be
 * decoded exactly (a lone surrogate escape). */
static PyObject *string_value(Scanner *s, const char *p, Py_ssize_t n, int escaped) {
    if (!escaped) return PyUnicode_DecodeUTF8(p, n, NULL);
    if ((size_t)n + 1 > s->scratch_cap) {
        char *grown = PyMem_RawRealloc(s->scratch, (size_t)n + 1);
        if (grown == NULL) return PyErr_NoMemory();
        s->scratch = grown;
        s->scratch_cap = (size_t)n + 1;
    }
    char *out = s->scratch; /* unescaped UTF-8 is never longer than its escaped form */
    const char *end = p + n;
    while (p < end) {
        if (*p != '\\') {
            *out++ = *p++;
            continue;
        }
        char c = p[1];
        p += 2;
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        default: { /* 'u', validated by scan_string */
            uint32_t cp = (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return NULL;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return NULL;
                uint32_t low =
                    (uint32_t)(hexval(p[2]) << 12 | hexval(p[3]) << 8 | hexval(p[4]) << 4 | hexval(p[5]));
                if (low < 0xDC00 || low > 0xDFFF) return NULL;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (cp < 0x80) {
                *out++ = (char)cp;
            } else if (cp < 0x800) {
                *out++ = (char)(0xC0 | (cp >> 6));
                *out++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *out++ = (char)(0xE0 | (cp >> 12));
                *out++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *out++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *out++ = (char)(0xF0 | (cp >> 18));
                *out++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *out++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *out++ = (char)(0x80 | (cp & 0x3F));
            }
        }
        }
    }
    return PyUnicode_DecodeUTF8(s->scratch, out - s->scratch, NULL);
}

static int id_of_key(Scanner *s, PyObject *key, int32_t *id) {
    PyObject *value = PyObject_GetItem(s->interner, key);
    if (value == NULL) return ERR;
    long v = PyLong_AsLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred()) return ERR;
    if (v < 0 || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "interner id out of int32 range");
        return ERR;
    }
    *id = (int32_t)v;
    return OK;
}

static Entry *find_entry(Scanner *s, uint64_t h, int tag, const char *p, Py_ssize_t n) {
    if (s->tcap == 0) return NULL;
    size_t j = h & (s->tcap - 1);
    while (s->table[j].bytes != NULL) {
        Entry *e = &s->table[j];
        if (e->hash == h && e->len == n && e->tag == tag && memcmp(e->bytes, p, (size_t)n) == 0) return e;
        j = (j + 1) & (s->tcap - 1);
    }
    return NULL;
}

/* The id of a text: TAG_STR (string content), TAG_INT (integer literal), TAG_RAW (JSON text). Runs
 * without the GIL: a text not interned yet gets a provisional id -(k + 1), k its index in the pending
 * list, which resolve_pending() replaces once the scan is over. */
static int intern(Scanner *s, int tag, const char *p, Py_ssize_t n, int escaped, int64_t ival, int32_t *id) {
    uint64_t h = hash_bytes(tag, p, n);
    Entry *e = find_entry(s, h, tag, p, n);
    if (e == NULL) {
        if ((s->tcount + 1) * 2 > s->tcap && grow_table(s) != OK) return ERR;
        char *copy = PyMem_RawMalloc(n ? (size_t)n : 1);
        if (copy == NULL) return out_of_memory(s);
        memcpy(copy, p, (size_t)n);
        size_t j = h & (s->tcap - 1);
        while (s->table[j].bytes != NULL) j = (j + 1) & (s->tcap - 1);
        s->table[j] = (Entry){h, copy, n, tag, -1, 0, 0};
        s->tcount++;
        e = &s->table[j];
    }
    if (e->id >= 0) {
        *id = e->id;
        return OK;
    }
    if (e->epoch != s->epoch) { /* first time in this scan (or left unresolved by a declined one) */
        if (s->npending == s->pending_cap) {
            size_t cap = s->pending_cap ? s->pending_cap * 2 : 256;
            Pending *grown = PyMem_RawRealloc(s->pending, cap * sizeof(Pending));
            if (grown == NULL) return out_of_memory(s);
            s->pending = grown;
            s->pending_cap = cap;
        }
        s->pending[s->npending] = (Pending){h, e->bytes, n, tag, escaped, ival};
        e->pending = (int32_t)s->npending++;
        e->epoch = s->epoch;
    }
    *id = -(e->pending + 1);
    return OK;
}

/* Intern the texts first seen in this scan (GIL held). BAIL when one cannot be decoded exactly. */
static int resolve_pending(Scanner *s) {
    if (s->npending == 0) return OK;
    int32_t *resolved = PyMem_RawRealloc(s->resolved, s->npending * sizeof(int32_t));
    if (resolved == NULL) {
        PyErr_NoMemory();
        return ERR;
    }
    s->resolved = resolved;
    for (size_t i = 0; i < s->npending; i++) {
        Pending *item = &s->pending[i];
        PyObject *key;
        if (item->tag == TAG_STR) {
            key = string_value(s, item->bytes, item->len, item->escaped);
            if (key == NULL) {
                if (!PyErr_Occurred()) return BAIL;
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return ERR;
                PyErr_Clear();
                return BAIL;
            }
        } else if (item->tag == TAG_INT) {
            key = PyLong_FromLongLong(item->ival);
        } else {
            key = PyBytes_FromStringAndSize(item->bytes, item->len);
        }
        if (key == NULL) return ERR;
        int status = id_of_key(s, key, &resolved[i]);
        Py_DECREF(key);
        if (status != OK) return status;
        find_entry(s, item->hash, item->tag, item->bytes, item->len)->id = resolved[i];
    }
    return OK;
}

/* ---------------------------------------------------------------- events */

static int ensure_rows(Scanner *s, size_t rows) {
    if (rows <= s->rows_cap) return OK;
    size_t cap = s->rows_cap ? s->rows_cap * 2 : 4096;
    while (cap < rows) cap *= 2;
    for (int i = 0; i < s->nfields; i++) {
        Field *f = &s->fields[i];
        if (f->type == T_ARGS) continue;
        char *data = PyMem_RawRealloc(f->data, cap * (size_t)f->width);
        if (data == NULL) return out_of_memory(s);
        f->data = data;
    }
    s->rows_cap = cap;
    return OK;
}

static inline void put_f8(Field *f, size_t row, double v) { ((double *)f->data)[row] = v; }
static inline void put_f4(Field *f, size_t row, double v) { ((float *)f->data)[row] = (float)v; }
static inline void put_i8(Field *f, size_t row, int64_t v) { ((int64_t *)f->data)[row] = v; }
static inline void put_i4(Field *f, size_t row, int32_t v) { ((int32_t *)f->data)[row] = v; }

static void write_default(Field *f, size_t row) {
    switch (f->type) {
    case T_F8: put_f8(f, row, f->fdefault); break;
    case T_F4: put_f4(f, row, f->fdefault); break;
    case T_I8:
    case T_FLOW: put_i8(f, row, f->idefault); break;
    case T_I4: put_i4(f, row, (int32_t)f->idefault); break;
    case T_STR:
    case T_RAW:
    case T_KEY: put_i4(f, row, f->default_id); break; /* interned in Scanner_init */
    default: break;
    }
}

/* One declared field's value at *pp (already past whitespace). */
static int read_field(Scanner *s, Field *f, const char **pp, const char *end, size_t row) {
    const char *p = *pp;
    Number number;
    int escaped, status;
    int32_t id;
    if (p >= end) return BAIL;
    char c = *p;
    switch (f->type) {
    case T_F8:
    case T_F4:
        if (!(c == '-' || is_digit(c))) return BAIL;
        if ((p = scan_number(s, p, end, &number, 1)) == NULL || !number.double_ok) return BAIL;
        if (number.is_int) { /* an integer becomes a float as msgspec converts it: -0 is 0.0 */
            if (!number.int_ok) return BAIL; /* huge integer literal: let msgspec decide */
            number.dval = (double)number.ival;
        }
        if (f->type == T_F8) put_f8(f, row, number.dval);
        else put_f4(f, row, number.dval);
        break;
    case T_I8:
    case T_I4:
        if (!(c == '-' || is_digit(c))) return BAIL;
        if ((p = scan_number(s, p, end, &number, 0)) == NULL || !number.int_ok) return BAIL;
        if (f->type == T_I8) {
            put_i8(f, row, number.ival);
        } else {
            if (number.ival < INT32_MIN || number.ival > INT32_MAX) {
                /* msgspec's lenient path leaves an out-of-range args value at its default (CUDA sync
                 * events carry stream 4294967295), provided the event has a string `ph`. */
                if (!f->in_args) return BAIL;
                put_i4(f, row, (int32_t)f->idefault);
                s->lenient = 1;
            } else {
                put_i4(f, row, (int32_t)number.ival);
            }
        }
        break;
    case T_FLOW:
        if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
            put_i8(f, row, -1);
            p += 4;
            break;
        }
        if (!(c == '-' || is_digit(c))) return BAIL;
        if ((p = scan_number(s, p, end, &number, 0)) == NULL || !number.int_ok) return BAIL;
        put_i8(f, row, number.ival);
        break;
    case T_STR:
    case T_KEY:
        if (c == '"') {
            const char *close = scan_string(p, end, &escaped);
            if (close == NULL) return BAIL;
            status = intern(s, TAG_STR, p + 1, close - p - 2, escaped, 0, &id);
            p = close;
        } else if (f->type == T_KEY && (c == '-' || is_digit(c))) {
            const char *stop = scan_number(s, p, end, &number, 0);
            if (stop == NULL || !number.int_ok) return BAIL;
            status = intern(s, TAG_INT, p, stop - p, 0, number.ival, &id);
            p = stop;
        } else {
            return BAIL;
        }
        if (status != OK) return status;
        put_i4(f, row, id);
        break;
    case T_RAW: {
        const char *stop = skip_value(s, p, end);
        if (stop == NULL) return BAIL;
        if ((status = intern(s, TAG_RAW, p, stop - p, 0, 0, &id)) != OK) return status;
        put_i4(f, row, id);
        p = stop;
        break;
    }
    default: return BAIL;
    }
    *pp = p;
    return OK;
}

/* The members of an object at *pp ('{'), matched against the fields listed in `which`. */
static inline unsigned key_bucket(const char *key, Py_ssize_t n) {
    if (n == 0) return 0;
    unsigned char first = (unsigned char)key[0], middle = (unsigned char)key[n / 2], last = (unsigned char)key[n - 1];
    return ((unsigned)n * 31u + first * 7u + middle * 3u + last) & (KEY_BUCKETS - 1);
}

static inline int key_matches(const Field *f, const char *key, Py_ssize_t n) {
    return f->key_len == n && memcmp(f->key, key, (size_t)n) == 0;
}

/* The declared field with this key at `level` (0: the event, 1: its args), -1 if none. */
static inline int find_field(const Scanner *s, int level, const char *key, Py_ssize_t n) {
    const int8_t *slots = s->buckets[level][key_bucket(key, n)];
    for (int i = 0; i < BUCKET_SLOTS && slots[i] >= 0; i++)
        if (key_matches(&s->fields[slots[i]], key, n)) return slots[i];
    for (int i = 0; i < s->noverflow[level]; i++)
        if (key_matches(&s->fields[s->overflow[level][i]], key, n)) return s->overflow[level][i];
    return -1;
}

static int read_object(Scanner *s, int level, const char **pp, const char *end, size_t row, uint64_t *seen) {
    const char *p = skip_ws(*pp + 1, end);
    int escaped, status;
    if (p < end && *p == '}') {
        *pp = p + 1;
        return OK;
    }
    for (;;) {
        if (p >= end || *p != '"') return BAIL;
        const char *close = scan_string(p, end, &escaped);
        if (close == NULL || escaped) return BAIL; /* an escaped key could spell a declared one */
        const char *key = p + 1;
        Py_ssize_t key_len = close - p - 2;
        p = skip_ws(close, end);
        if (p >= end || *p != ':') return BAIL;
        p = skip_ws(p + 1, end);
        int match = find_field(s, level, key, key_len);
        if (match < 0 && level == 0 && p < end && *p == '"') {
            if ((p = scan_string(p, end, &escaped)) == NULL) return BAIL;
        } else if (match < 0 && level == 0 && p < end && (*p == '-' || is_digit(*p))) {
            Number number; /* the lenient path decodes these: it drops the event for a value it cannot */
            if ((p = scan_number(s, p, end, &number, 1)) == NULL) return BAIL;
            if (number.is_int ? !number.int_ok : !number.double_ok) s->risky = 1;
        } else if (match < 0) {
            if (level == 0) s->risky = 1;
            if ((p = skip_value(s, p, end)) == NULL) return BAIL;
        } else {
            if (*seen & (1ULL << match)) return BAIL; /* a repeated declared key */
            *seen |= 1ULL << match;
            Field *f = &s->fields[match];
            if (f->type == T_ARGS) {
                if (p >= end || *p != '{') return BAIL;
                if ((status = read_object(s, 1, &p, end, row, seen)) != OK) return status;
            } else if ((status = read_field(s, f, &p, end, row)) != OK) {
                return status;
            }
        }
        p = skip_ws(p, end);
        if (p >= end) return BAIL;
        if (*p == '}') {
            *pp = p + 1;
            return OK;
        }
        if (*p != ',') return BAIL;
        p = skip_ws(p + 1, end);
    }
}

static int read_event(Scanner *s, const char **pp, const char *end, size_t row) {
    uint64_t seen = 0;
    s->lenient = s->risky = 0;
    int status = read_object(s, 0, pp, end, row, &seen);
    if (status != OK) return status;
    /* the lenient path drops an event without a string `ph`, or with a top-level value it cannot decode */
    if (s->lenient && (s->risky || s->ph_field < 0 || !(seen & (1ULL << s->ph_field)))) return BAIL;
    for (int i = 0; i < s->nfields; i++) {
        if (!(seen & (1ULL << i)) && s->fields[i].type != T_ARGS) write_default(&s->fields[i], row);
    }
    return OK;
}

/* ---------------------------------------------------------------- the Scanner type */

static void Scanner_clear_fields(Scanner *s) {
    for (int i = 0; i < s->nfields; i++) {
        PyMem_RawFree(s->fields[i].key);
        PyMem_RawFree(s->fields[i].data);
    }
    s->nfields = 0;
}

static void Scanner_clear_table(Scanner *s) {
    for (size_t i = 0; i < s->tcap; i++) PyMem_RawFree(s->table[i].bytes);
    PyMem_RawFree(s->table);
    s->table = NULL;
    s->tcap = s->tcount = 0;
}

static void Scanner_dealloc(Scanner *s) {
    Scanner_clear_fields(s);
    Scanner_clear_table(s);
    PyMem_RawFree(s->scratch);
    PyMem_RawFree(s->pending);
    PyMem_RawFree(s->resolved);
    Py_CLEAR(s->interner);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int Scanner_init(Scanner *s, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"interner", "fields", NULL};
    PyObject *interner, *fields;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO", names, &interner, &fields)) return -1;
    PyObject *seq = PySequence_Fast(fields, "fields must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_FIELDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many fields");
        return -1;
    }
    if (s->busy) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_RuntimeError, "cannot re-initialise a Scanner while it scans");
        return -1;
    }
    s->ready = 0;
    Scanner_clear_fields(s);
    Scanner_clear_table(s); /* its ids belong to the previous interner */
    s->rows_cap = 0;
    Py_XSETREF(s->interner, Py_NewRef(interner));

    s->noverflow[0] = s->noverflow[1] = 0;
    memset(s->buckets, -1, sizeof(s->buckets));
    s->ph_field = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *key;
        Py_ssize_t key_len;
        int in_args, type;
        double fdefault;
        PyObject *default_key;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#pidO", &key, &key_len, &in_args, &type,
                              &fdefault, &default_key)) {
            Py_DECREF(seq);
            return -1;
        }
        if (type < T_F8 || type > T_ARGS) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "unknown field type");
            return -1;
        }
        Field *f = &s->fields[i];
        memset(f, 0, sizeof(*f));
        s->nfields = (int)i + 1; /* from here on, Scanner_clear_fields releases this field on an error */
        f->key = PyMem_RawMalloc((size_t)key_len + 1);
        if (f->key == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(f->key, key, (size_t)key_len + 1);
        f->key_len = key_len;
        f->type = type;
        f->in_args = in_args;
        f->fdefault = fdefault;
        f->idefault = isfinite(fdefault) ? (int64_t)fdefault : 0; /* float fields keep fdefault (NaN) */
        if ((type == T_STR || type == T_RAW || type == T_KEY) && id_of_key(s, default_key, &f->default_id) != OK) {
            Py_DECREF(seq);
            return -1;
        }
        f->width = (type == T_F8 || type == T_I8 || type == T_FLOW) ? 8 : 4;
        if (!in_args && type == T_STR && key_len == 2 && memcmp(key, "ph", 2) == 0) s->ph_field = (int)i;
        int8_t *slots = s->buckets[in_args ? 1 : 0][key_bucket(key, key_len)];
        int slot = 0;
        while (slot < BUCKET_SLOTS && slots[slot] >= 0) slot++;
        if (slot < BUCKET_SLOTS) slots[slot] = (int8_t)i;
        else s->overflow[in_args ? 1 : 0][s->noverflow[in_args ? 1 : 0]++] = (int)i;
    }
    Py_DECREF(seq);
    s->ready = 1;
    return 0;
}

/* The events of the array at p (`items`: the comma-separated events of an array, without its brackets);
 * runs without the GIL. */
static int scan_array(Scanner *s, const char *p, const char *end, int items, size_t *rows_out) {
    size_t rows = 0;
    int status;
    p = skip_ws(p, end);
    if (!items) {
        if (p >= end || *p != '[') return BAIL;
        p = skip_ws(p + 1, end);
    }
    if (!items && p < end && *p == ']') {
        p++;
    } else if (!(items && p == end)) {
        for (;;) {
            if (p >= end || *p != '{') return BAIL;
            if ((status = ensure_rows(s, rows + 1)) != OK) return status;
            if ((status = read_event(s, &p, end, rows)) != OK) return status;
            rows++;
            p = skip_ws(p, end);
            if (items && p == end) break;
            if (p >= end) return BAIL;
            if (!items && *p == ']') {
                p++;
                break;
            }
            if (*p != ',') return BAIL;
            p = skip_ws(p + 1, end);
        }
    }
    *rows_out = rows;
    return skip_ws(p, end) == end ? OK : BAIL;
}

/* Provisional ids (< 0) of texts first seen in this scan -> their interner ids. */
static void fix_provisional_ids(Scanner *s, size_t rows) {
    if (s->npending == 0) return;
    for (int i = 0; i < s->nfields; i++) {
        Field *f = &s->fields[i];
        if (f->type != T_STR && f->type != T_RAW && f->type != T_KEY) continue;
        int32_t *ids = (int32_t *)f->data;
        for (size_t r = 0; r < rows; r++)
            if (ids[r] < 0) ids[r] = s->resolved[-ids[r] - 1];
    }
}

PyDoc_STRVAR(scan_doc,
             "scan(text[, start, end]) -> (count, [bytearray per field]) | None\n\n"
             "Columns of a JSON array of events (with start and end: of the comma-separated events in "
             "text[start:end], an array's items without its brackets), or None when the text is not in the strict shape this scanner "
             "decodes exactly (the caller then decodes it with msgspec). The text is read without the GIL, so "
             "scanners of different threads run in parallel; one scanner serves one thread at a time.");

static PyObject *Scanner_scan(Scanner *s, PyObject *args) {
    PyObject *arg;
    Py_ssize_t start = -1, stop = -1;
    if (!PyArg_ParseTuple(args, "O|nn:scan", &arg, &start, &stop)) return NULL;
    if (!s->ready) {
        PyErr_SetString(PyExc_RuntimeError, "the Scanner is not initialised");
        return NULL;
    }
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Scanner serves one thread at a time");
        return NULL;
    }
    if (!PyBytes_Check(arg)) { /* immutable: no other thread can change it while the GIL is released */
        PyErr_SetString(PyExc_TypeError, "scan() takes bytes");
        return NULL;
    }
    int items = PyTuple_GET_SIZE(args) > 1;
    if (PyTuple_GET_SIZE(args) == 2) {
        PyErr_SetString(PyExc_TypeError, "scan() takes both start and end, or neither");
        return NULL;
    }
    if (items && (start < 0 || stop < start || stop > PyBytes_GET_SIZE(arg))) {
        PyErr_SetString(PyExc_ValueError, "scan(): start and end must satisfy 0 <= start <= end <= len(text)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    size_t rows = 0;
    s->busy = 1;
    if (++s->epoch == 0) { /* wrapped after 2**32 scans: forget every entry's pending mark */
        s->epoch = 1;
        for (size_t i = 0; i < s->tcap; i++) s->table[i].epoch = 0;
    }
    s->npending = 0;
    s->nomem = 0;
    s->released = PyEval_SaveThread();
    const char *first = (const char *)view.buf + (items ? start : 0);
    const char *last = (const char *)view.buf + (items ? stop : view.len);
    int status = scan_array(s, first, last, items, &rows);
    PyEval_RestoreThread(s->released);
    s->released = NULL;
    PyBuffer_Release(&view);
    if (status == ERR && s->nomem) PyErr_NoMemory();
    if (status == OK) status = resolve_pending(s);
    s->busy = 0;
    if (status == ERR) return NULL;
    if (status == BAIL) Py_RETURN_NONE;
    fix_provisional_ids(s, rows);
    PyObject *columns = PyList_New(0);
    if (columns == NULL) return NULL;
    for (int i = 0; i < s->nfields; i++) {
        Field *f = &s->fields[i];
        PyObject *column = f->type == T_ARGS ? Py_NewRef(Py_None)
                                             : PyByteArray_FromStringAndSize(f->data, (Py_ssize_t)(rows * f->width));
        if (column == NULL || PyList_Append(columns, column) != 0) {
            Py_XDECREF(column);
            Py_DECREF(columns);
            return NULL;
        }
        Py_DECREF(column);
    }
    return Py_BuildValue("(nN)", (Py_ssize_t)rows, columns);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "torchscope.trace._fastscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(interner, fields): decodes event batches into columns, interning through `interner`.",
    .tp_methods = Scanner_methods,
    .tp_init = (initproc)Scanner_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastscan", "Kineto event batches from JSON text straight into columns.", -1, NULL,
};

PyMODINIT_FUNC PyInit__fastscan(void) {
#ifdef HAVE_STRTOD_L
    if (c_locale == (locale_t)0 && (c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0)) == (locale_t)0) {
        PyErr_SetString(PyExc_OSError, "cannot create the C locale");
        return NULL;
    }
#endif
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0 ||
        PyModule_AddIntConstant(m, "T_F8", T_F8) < 0 || PyModule_AddIntConstant(m, "T_F4", T_F4) < 0 ||
        PyModule_AddIntConstant(m, "T_I8", T_I8) < 0 || PyModule_AddIntConstant(m, "T_I4", T_I4) < 0 ||
        PyModule_AddIntConstant(m, "T_STR", T_STR) < 0 || PyModule_AddIntConstant(m, "T_RAW", T_RAW) < 0 ||
        PyModule_AddIntConstant(m, "T_KEY", T_KEY) < 0 || PyModule_AddIntConstant(m, "T_FLOW", T_FLOW) < 0 ||
        PyModule_AddIntConstant(m, "T_ARGS", T_ARGS) < 0 || PyModule_AddIntConstant(m, "SPEC_VERSION", SPEC_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
