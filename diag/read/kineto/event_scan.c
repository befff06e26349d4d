/* A batch of a Kineto trace's events read as columns, in one pass over the JSON text
 * (issue 43: the per-event Python of decoding every event into a struct and then reading
 * its fields was most of a trace's parse). Python: diag/read/kineto/scanned.py.
 *
 *   scan(text, first, end, rows, times, strings) -> (status, events, distinct strings)
 *
 * text[first:end] is the batch as stream.py cuts it: events (JSON objects) separated by
 * commas. Each event is one row of `rows` (int64, NCOL columns) and of `times` (double, 2
 * columns): where it is in the text, and the fields one_pass.take reads of it (ph, cat,
 * name, ts, dur, tid, args' correlation and stream, whether args name a collective, where the
 * args object's text starts and ends, and where the values of its `correlation` and
 * `External id` are: 0 and 0 where it has none, or more than one). cat and name are codes into
 * `strings` (int64 pairs: offset and length in text of each distinct string, first seen
 * first).
 *
 * What it promises, so that the caller may use the rows instead of msgspec's decoding:
 * - status 0: every event is a well-formed JSON object, so msgspec decodes the batch too
 *   (the caller's fallback, which keeps every decision about text this reader is unsure of,
 *   is msgspec itself). A row whose kind is ODD holds something this reader does not read
 *   exactly as msgspec does (an escaped string among the fields, a float it does not parse
 *   exactly, a thread that is a string, a duplicated key, a byte outside ASCII or a
 *   \u escape anywhere, a number it does not bound): the caller decodes that event alone
 *   with msgspec.
 * - status -1: the text is not such a batch, or is one this reader does not check (nesting
 *   over MAX_DEPTH): the caller decodes the whole batch with msgspec, which accepts it or
 *   says why not, as before this reader.
 * - status -2: more events than rows: the caller asks again with more.
 * Nothing is allocated from the text's numbers; the one allocation is the strings' hash
 * table, sized by the rows given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    C_KIND, C_START, C_END, C_PH, C_CAT, C_NAME, C_TS_KIND, C_TS, C_DUR_KIND, C_DUR,
    C_TID_KIND, C_TID, C_ARGS, C_CORRELATION_KIND, C_CORRELATION, C_STREAM_KIND, C_STREAM,
    C_COLLECTIVE, C_ARGS_START, C_ARGS_END, C_CORRELATION_AT, C_CORRELATION_END,
    C_EXTERNAL_AT, C_EXTERNAL_END, NCOL
};
enum { F_TS, F_DUR, NFLOAT };
enum { PLAIN = 0, ODD = 1 };
enum { NONE = 0, INT = 1, FLOAT = 2 };
enum { PH_NONE = 0, PH_X = 1, PH_OTHER = 2 };

#define MAX_DEPTH 64
#define MAX_EXACT_POWER 22              /* 10**22 is the largest power of ten a double holds */
#define EXACT_INTEGERS (1ULL << 53)     /* every integer up to this is a double */
#define MAX_NUMBER_DIGITS 40
#define MAX_EXPONENT_DIGITS 3

typedef struct {
    const unsigned char *s;
    Py_ssize_t i, n;
    int odd;             /* the current event holds what msgspec must read */
    int64_t *strings;    /* (offset, length) per distinct string */
    Py_ssize_t nstrings, max_strings;
    int64_t *slots;      /* hash table: code + 1, 0 empty */
    Py_ssize_t mask;
} Reader;

static const double POW10[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

static void skip_ws(Reader *r) {
    while (r->i < r->n) {
        unsigned char c = r->s[r->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
        r->i++;
    }
}

/* The bytes that end a run of plain characters in a string: the quote, the backslash, a
 * control character (not JSON) and a byte beyond ASCII (made by init_tables). */
static unsigned char STOPS_A_STRING[256];

static void init_tables(void) {
    for (int c = 0; c < 256; c++)
        STOPS_A_STRING[c] = c == '"' || c == '\\' || c < 0x20 || c > 0x7f;
}

static int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A string at r->i (its opening quote). Its content's offset and length; `plain` is 1 when
 * the content is printable ASCII without escapes (read as its bytes). Returns -1 on text
 * that is not a JSON string. Escapes other than \u are read as JSON says; a \u escape or a
 * byte over 0x7f makes the event ODD (msgspec judges it). */
static int read_string(Reader *r, Py_ssize_t *start, Py_ssize_t *length, int *plain) {
    Py_ssize_t i = r->i + 1;
    *plain = 1;
    *start = i;
    for (;;) {
        while (i < r->n && !STOPS_A_STRING[r->s[i]]) i++; /* the run of plain characters */
        if (i >= r->n) break;
        unsigned char c = r->s[i];
        if (c == '"') {
            *length = i - *start;
            r->i = i + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            *plain = 0;
            if (i + 1 >= r->n) return -1;
            unsigned char e = r->s[i + 1];
            if (e == 'u') {
                if (i + 5 >= r->n) return -1;
                for (int k = 2; k < 6; k++)
                    if (!is_hex(r->s[i + k])) return -1;
                r->odd = 1;
                i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return -1;
            i += 2;
            continue;
        }
        if (c > 0x7f) {
            *plain = 0;
            r->odd = 1;
        }
        i++;
    }
    return -1;
}

/* A number at r->i. kind INT (value in *whole), FLOAT (a decimal without exponent: exactly
 * the double Python's float() gives), or
 * NONE with r->odd set (anything else valid). Not `exact` (a value passed over): only
 * checked, ODD past MAX_NUMBER_DIGITS or MAX_EXPONENT_DIGITS. -1 on text not a number. */
static int read_number(Reader *r, int exact, int *kind, int64_t *whole, double *value) {
    Py_ssize_t i = r->i, start = r->i;
    int negative = 0, digits = 0, fraction = 0, exponent = 0;
    uint64_t m = 0;
    int overflow = 0;
    if (i < r->n && r->s[i] == '-') {
        negative = 1;
        i++;
    }
    if (i >= r->n || r->s[i] < '0' || r->s[i] > '9') return -1;
    if (r->s[i] == '0') {
        i++;
        digits = 1;
        if (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') return -1; /* a leading zero */
    } else {
        while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') {
            if (m > (UINT64_MAX - 9) / 10) overflow = 1;
            else m = m * 10 + (uint64_t)(r->s[i] - '0');
            digits++;
            i++;
        }
    }
    if (i < r->n && r->s[i] == '.') {
        i++;
        if (i >= r->n || r->s[i] < '0' || r->s[i] > '9') return -1;
        while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') {
            if (m > (UINT64_MAX - 9) / 10) overflow = 1;
            else m = m * 10 + (uint64_t)(r->s[i] - '0');
            fraction++;
            digits++;
            i++;
        }
    }
    if (i < r->n && (r->s[i] == 'e' || r->s[i] == 'E')) {
        i++;
        if (i < r->n && (r->s[i] == '+' || r->s[i] == '-')) i++;
        if (i >= r->n || r->s[i] < '0' || r->s[i] > '9') return -1;
        while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') {
            exponent++;
            i++;
        }
    }
    r->i = i;
    *kind = NONE;
    if (!exact) { /* a value passed over: checked, not read (bounded, so msgspec's too) */
        if (digits > MAX_NUMBER_DIGITS || exponent > MAX_EXPONENT_DIGITS) r->odd = 1;
        return 0;
    }
    if (exponent || overflow || digits > MAX_NUMBER_DIGITS) {
        r->odd = 1;
        return 0;
    }
    if (!fraction) {
        if (m > (uint64_t)INT64_MAX) {
            r->odd = 1;
            return 0;
        }
        *whole = negative ? -(int64_t)m : (int64_t)m;
        *kind = INT;
        return 0;
    }
    if (fraction <= MAX_EXACT_POWER && m <= EXACT_INTEGERS) {
        /* both exact doubles: one division, rounded once, is the correctly rounded value */
        double v = (double)m / POW10[fraction];
        *value = negative ? -v : v;
        *kind = FLOAT;
        return 0;
    }
    /* more digits: Python's own correctly rounded conversion (float()'s); msgspec's is
     * correctly rounded too, so the same double */
    if (i >= r->n) { /* nothing after it in the batch: not read past the batch's end */
        r->odd = 1;
        return 0;
    }
    char *stop = NULL;
    double v = PyOS_string_to_double((const char *)r->s + start, &stop, NULL);
    if ((v == -1.0 && PyErr_Occurred()) || stop != (const char *)r->s + i) {
        PyErr_Clear();
        r->odd = 1;
        return 0;
    }
    *value = v;
    *kind = FLOAT;
    return 0;
}

/* An object's members (an array's items alike, with ']'), read by its reader in a loop:
 *   ends = opens(r, '}');  (1: an empty object, done)
 *   while (!ends) { read_key(...); <its value>; ends = item_ends(r, '}'); <-1: not JSON> }
 */
/* At an object's `{` (an array's `[`): passed, and 1 when it is empty (`close` passed too). */
static int opens(Reader *r, char close) {
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        return 1;
    }
    return 0;
}

/* A member's key and its colon, up to its value; -1 on text that is not that. */
static int read_key(Reader *r, Py_ssize_t *start, Py_ssize_t *length, int *plain) {
    if (r->i >= r->n || r->s[r->i] != '"') return -1;
    if (read_string(r, start, length, plain)) return -1;
    skip_ws(r);
    if (r->i >= r->n || r->s[r->i] != ':') return -1;
    r->i++;
    skip_ws(r);
    return 0;
}

/* After a member's value (an item's): 1 at the object's end (`close` passed), 0 before
 * another member (its comma passed), -1 on text that is neither. */
static int item_ends(Reader *r, char close) {
    skip_ws(r);
    if (r->i >= r->n) return -1;
    if (r->s[r->i] == close) {
        r->i++;
        return 1;
    }
    if (r->s[r->i] != ',') return -1;
    r->i++;
    skip_ws(r);
    return 0;
}

static int skip_value(Reader *r, int depth);

static int skip_literal(Reader *r, const char *word) {
    Py_ssize_t k = (Py_ssize_t)strlen(word);
    if (r->i + k > r->n || memcmp(r->s + r->i, word, (size_t)k) != 0) return -1;
    r->i += k;
    return 0;
}

static int skip_object(Reader *r, int depth) {
    Py_ssize_t start, length;
    int plain, ends = opens(r, '}');
    while (!ends) {
        if (read_key(r, &start, &length, &plain) || skip_value(r, depth + 1)) return -1;
        if ((ends = item_ends(r, '}')) < 0) return -1;
    }
    return 0;
}

static int skip_array(Reader *r, int depth) {
    int ends = opens(r, ']');
    while (!ends) {
        if (skip_value(r, depth + 1)) return -1;
        if ((ends = item_ends(r, ']')) < 0) return -1;
    }
    return 0;
}

/* Any JSON value at r->i, checked and passed over. */
static int skip_value(Reader *r, int depth) {
    Py_ssize_t start, length;
    int plain, kind;
    int64_t whole;
    double value;
    if (depth > MAX_DEPTH || r->i >= r->n) return -1;
    switch (r->s[r->i]) {
    case '"': return read_string(r, &start, &length, &plain);
    case '{': return skip_object(r, depth);
    case '[': return skip_array(r, depth);
    case 't': return skip_literal(r, "true");
    case 'f': return skip_literal(r, "false");
    case 'n': return skip_literal(r, "null");
    default: return read_number(r, 0, &kind, &whole, &value);
    }
}

static int is_null(Reader *r) {
    return r->i + 4 <= r->n && memcmp(r->s + r->i, "null", 4) == 0;
}

static uint64_t hash_of(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t k = 0; k < n; k++) h = (h ^ s[k]) * 1099511628211ULL;
    return h;
}

/* The code of the string text[start:start+length] (a new code the first time). */
static int64_t intern(Reader *r, Py_ssize_t start, Py_ssize_t length) {
    Py_ssize_t slot = (Py_ssize_t)(hash_of(r->s + start, length) & (uint64_t)r->mask);
    for (;;) {
        int64_t found = r->slots[slot];
        if (found == 0) break;
        int64_t *known = r->strings + 2 * (found - 1);
        if (known[1] == length && memcmp(r->s + known[0], r->s + start, (size_t)length) == 0)
            return found - 1;
        slot = (slot + 1) & r->mask;
    }
    if (r->nstrings >= r->max_strings) return -2;
    r->strings[2 * r->nstrings] = start;
    r->strings[2 * r->nstrings + 1] = length;
    r->slots[slot] = ++r->nstrings;
    return r->nstrings - 1;
}

/* A field that is a string read as its bytes (ph, cat, name): its code, -1 for null; ODD
 * for another value or a string with escapes or bytes beyond ASCII. -3: not JSON. */
static int64_t read_label(Reader *r) {
    Py_ssize_t start, length;
    int plain;
    if (r->i < r->n && r->s[r->i] == '"') {
        if (read_string(r, &start, &length, &plain)) return -3;
        if (!plain) {
            r->odd = 1;
            return -1;
        }
        return intern(r, start, length);
    }
    if (is_null(r)) {
        r->i += 4;
        return -1;
    }
    r->odd = 1;
    return skip_value(r, 1) ? -3 : -1;
}

/* A time (ts, dur) or an id (tid, correlation, stream): its kind and value. */
static int read_time(Reader *r, int64_t *row, double *times, int kind_col, int value_col,
                     int float_col) {
    int kind;
    int64_t whole = 0;
    double value = 0.0;
    unsigned char c = r->i < r->n ? r->s[r->i] : 0;
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (read_number(r, 1, &kind, &whole, &value)) return -1;
        if (kind == FLOAT && float_col < 0) { /* an id written as a float: msgspec's */
            r->odd = 1;
            kind = NONE;
        }
        row[kind_col] = kind;
        row[value_col] = whole;
        if (float_col >= 0) times[float_col] = value;
        return 0;
    }
    if (is_null(r)) {
        r->i += 4;
        row[kind_col] = NONE;
        return 0;
    }
    r->odd = 1;
    row[kind_col] = NONE;
    return skip_value(r, 1);
}

static int key_is(Reader *r, Py_ssize_t start, Py_ssize_t length, const char *word) {
    return (size_t)length == strlen(word) && memcmp(r->s + start, word, (size_t)length) == 0;
}

/* `args`: the correlation and stream (ints, else ODD), whether it names a collective, and
 * where the values of its two per-event ids are (`correlation`, `External id`: the caller
 * knows an argument text it has seen with other ids). */
static int read_args(Reader *r, int64_t *row) {
    Py_ssize_t start, length, at;
    int plain, seen = 0, external = 0, ends = opens(r, '}');
    double unused;
    while (!ends) {
        if (read_key(r, &start, &length, &plain)) return -1;
        int which = 0, is_external = 0;
        at = r->i;
        if (!plain) r->odd = 1; /* an escaped key could be any of them */
        else if (key_is(r, start, length, "correlation")) which = 1;
        else if (key_is(r, start, length, "stream")) which = 2;
        else if (key_is(r, start, length, "Collective name")) row[C_COLLECTIVE] = 1;
        else if (key_is(r, start, length, "External id")) is_external = 1;
        if (which) {
            if (seen & which) r->odd = 1;
            seen |= which;
            int kind_col = which == 1 ? C_CORRELATION_KIND : C_STREAM_KIND;
            if (read_time(r, row, &unused, kind_col, kind_col + 1, -1)) return -1;
            if (row[kind_col] != INT) r->odd = 1; /* null is not absent: msgspec's */
            if (which == 1) {
                row[C_CORRELATION_AT] = at;
                row[C_CORRELATION_END] = r->i;
            }
        } else if (skip_value(r, 2)) {
            return -1;
        }
        if (is_external && ++external == 1) {
            row[C_EXTERNAL_AT] = at;
            row[C_EXTERNAL_END] = r->i;
        }
        if ((ends = item_ends(r, '}')) < 0) return -1;
    }
    if (external > 1) row[C_EXTERNAL_AT] = row[C_EXTERNAL_END] = 0;
    return 0;
}

enum { K_PH = 1, K_CAT = 2, K_NAME = 4, K_TS = 8, K_DUR = 16, K_TID = 32, K_ARGS = 64 };

/* One event at r->i (its `{`) into `row` and `times`. Returns -1 on text that is not an
 * object, -2 when the strings' table is full. */
static int read_event(Reader *r, int64_t *row, double *times) {
    Py_ssize_t start, length;
    int plain, seen = 0;
    memset(row, 0, NCOL * sizeof(int64_t));
    row[C_CAT] = row[C_NAME] = -1;
    times[F_TS] = times[F_DUR] = 0.0;
    r->odd = 0;
    row[C_START] = r->i;
    if (r->i >= r->n || r->s[r->i] != '{') return -1;
    int ends = opens(r, '}');
    while (!ends) {
        if (read_key(r, &start, &length, &plain)) return -1;
        int key = 0;
        if (!plain) r->odd = 1;
        else if (length == 2 && key_is(r, start, length, "ph")) key = K_PH;
        else if (key_is(r, start, length, "cat")) key = K_CAT;
        else if (key_is(r, start, length, "name")) key = K_NAME;
        else if (length == 2 && key_is(r, start, length, "ts")) key = K_TS;
        else if (key_is(r, start, length, "dur")) key = K_DUR;
        else if (key_is(r, start, length, "tid")) key = K_TID;
        else if (key_is(r, start, length, "args")) key = K_ARGS;
        if (key & seen) r->odd = 1;
        seen |= key;
        int64_t code;
        switch (key) {
        case K_PH:
            code = read_label(r);
            if (code == -3) return -1;
            if (code == -2) return -2;
            if (code >= 0) {
                const int64_t *s = r->strings + 2 * code;
                row[C_PH] = (s[1] == 1 && r->s[s[0]] == 'X') ? PH_X : PH_OTHER;
            } else {
                row[C_PH] = PH_NONE;
            }
            break;
        case K_CAT:
        case K_NAME:
            code = read_label(r);
            if (code == -3) return -1;
            if (code == -2) return -2;
            row[key == K_CAT ? C_CAT : C_NAME] = code;
            break;
        case K_TS:
            if (read_time(r, row, times, C_TS_KIND, C_TS, F_TS)) return -1;
            break;
        case K_DUR:
            if (read_time(r, row, times, C_DUR_KIND, C_DUR, F_DUR)) return -1;
            break;
        case K_TID:
            if (read_time(r, row, times, C_TID_KIND, C_TID, -1)) return -1;
            break;
        case K_ARGS:
            if (r->i < r->n && r->s[r->i] == '{') {
                row[C_ARGS] = 1;
                row[C_ARGS_START] = r->i;
                if (read_args(r, row)) return -1;
                row[C_ARGS_END] = r->i;
            } else if (is_null(r)) {
                r->i += 4;
            } else {
                r->odd = 1; /* msgspec refuses it, or not: its call */
                if (skip_value(r, 1)) return -1;
            }
            break;
        default:
            if (skip_value(r, 1)) return -1;
        }
        if ((ends = item_ends(r, '}')) < 0) return -1;
    }
    row[C_END] = r->i;
    row[C_KIND] = r->odd ? ODD : PLAIN;
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer text, rows, times, strings;
    Py_ssize_t first, end;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnw*w*w*", &text, &first, &end, &rows, &times, &strings))
        return NULL;
    long status = 0;
    Py_ssize_t capacity = rows.len / (Py_ssize_t)(NCOL * sizeof(int64_t));
    Py_ssize_t events = 0;
    Reader r;
    r.s = (const unsigned char *)text.buf;
    r.n = end;
    r.i = first;
    r.strings = (int64_t *)strings.buf;
    r.max_strings = strings.len / (Py_ssize_t)(2 * sizeof(int64_t));
    r.nstrings = 0;
    Py_ssize_t slots = 16;
    while (slots < 2 * r.max_strings) slots *= 2;
    r.mask = slots - 1;
    r.slots = NULL;
    if (first < 0 || end > text.len || first >= end ||
        times.len / (Py_ssize_t)(NFLOAT * sizeof(double)) < capacity) {
        status = -1;
        goto done;
    }
    r.slots = (int64_t *)PyMem_Calloc((size_t)slots, sizeof(int64_t));
    if (r.slots == NULL) {
        PyBuffer_Release(&text);
        PyBuffer_Release(&rows);
        PyBuffer_Release(&times);
        PyBuffer_Release(&strings);
        return PyErr_NoMemory();
    }
    for (;;) {
        if (events >= capacity) {
            status = -2;
            break;
        }
        int got = read_event(&r, (int64_t *)rows.buf + events * NCOL,
                             (double *)times.buf + events * NFLOAT);
        if (got) {
            status = got;
            break;
        }
        events++;
        skip_ws(&r);
        if (r.i >= r.n) break;
        if (r.s[r.i] != ',') {
            status = -1;
            break;
        }
        r.i++;
        skip_ws(&r);
    }
done:
    PyMem_Free(r.slots);
    PyBuffer_Release(&text);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&times);
    PyBuffer_Release(&strings);
    return Py_BuildValue("lnn", status, events, r.nstrings);
}

/* cut_texts(text, spans) -> [bytes]: for each row of `spans` (int64, six a row: a start,
 * two cuts as start and end, an end), text[start:end] without the two cuts. Each row must
 * hold start <= cut <= cut <= cut <= cut <= end <= len(text) (ValueError else): scanned.py
 * gives an argument object's span and its ids' values, for a key of the text without them. */
static PyObject *cut_texts(PyObject *self, PyObject *args) {
    Py_buffer text, spans;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*", &text, &spans)) return NULL;
    PyObject *out = NULL;
    const Py_ssize_t width = 6 * (Py_ssize_t)sizeof(int64_t);
    if (spans.len % width != 0) {
        PyErr_SetString(PyExc_ValueError, "spans: six int64 a row");
        goto done;
    }
    Py_ssize_t count = spans.len / width;
    const int64_t *row = (const int64_t *)spans.buf;
    const char *s = (const char *)text.buf;
    out = PyList_New(count);
    if (out == NULL) goto done;
    for (Py_ssize_t k = 0; k < count; k++, row += 6) {
        int ordered = 0 <= row[0] && row[5] <= text.len;
        for (int j = 0; j < 5; j++) ordered = ordered && row[j] <= row[j + 1];
        if (!ordered) {
            PyErr_SetString(PyExc_ValueError, "spans: a row out of order or out of the text");
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t first = row[1] - row[0], middle = row[3] - row[2], last = row[5] - row[4];
        PyObject *key = PyBytes_FromStringAndSize(NULL, first + middle + last);
        if (key == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        char *to = PyBytes_AS_STRING(key);
        memcpy(to, s + row[0], (size_t)first);
        memcpy(to + first, s + row[2], (size_t)middle);
        memcpy(to + first + middle, s + row[4], (size_t)last);
        PyList_SET_ITEM(out, k, key);
    }
done:
    PyBuffer_Release(&text);
    PyBuffer_Release(&spans);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "A batch of trace events as columns (see the source)."},
    {"cut_texts", cut_texts, METH_VARARGS, "Texts without two spans each (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "event_scan", "A Kineto trace's events read as columns.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_event_scan(void) {
    init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "NCOL", NCOL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
