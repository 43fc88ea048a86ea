/* sampler.c: per-request token sampling and log-probabilities (see the
 * "sampling" block of qwen35.h).
 *
 * Data flow for one token: the raw logits of a position come in; the
 * penalties edit the few entries of tokens seen so far (kept as lists, so the
 * cost does not grow with the vocabulary); then, unless the draw can be made
 * straight from the full softmax, candidates are ranked (ties broken by the
 * lower id, so the order never depends on the sort algorithm), cut by top-k,
 * top-p and min-p, tempered, and one draw from the xoshiro256** generator
 * picks the token. All buffers are sized in q35_sampler_new. */
#include "qwen35.h"
#include "base/util.h"
#include "core/generate.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float logit; int32_t id; } candidate;
_Static_assert(sizeof(candidate) >= sizeof(float), "the candidates' scratch holds the uncut draw's weights");

struct q35_sampler {
    q35_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];        /* xoshiro256** state */
    int32_t *out_count;     /* (n_vocab) occurrences of each token in the output */
    int32_t *out_ids;       /* (n_vocab) distinct output tokens, in first-seen order */
    int32_t n_out_ids;
    uint8_t *in_prompt;     /* (n_vocab) 1 when the token is in the prompt */
    int32_t *prompt_ids;    /* (n_vocab) distinct prompt tokens */
    int32_t n_prompt_ids;
    uint8_t *penalised;     /* (n_vocab) scratch mark for the repetition penalty */
    candidate *cand;        /* (n_vocab) */
    double *block_sums;     /* (SAMPLER_BLOCKS(n_vocab)) the uncut draw's weights by block */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---- the softmax's weights: e^x in float, the same bits on every machine ----
 * Four lanes at a time in GCC's generic vectors (SSE2 on a baseline x86-64 build), each product
 * and sum rounded once (ISO C: no contraction; a * b + c never written as one expression), so a lane
 * gives the bits of the scalar form on any machine. Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2
 * (ln2 in two parts, n ln2's first part exact), a degree-6 polynomial in r, times 2^n from the exponent
 * bits; 0 below -87 (a weight under FLT_MIN of the best token's 1) and at -inf; within 1 ulp of exp
 * elsewhere (0.98 at worst over 2^24 points; tests). */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) f32x4 exp4(f32x4 x) {
    const i32x4 dead = x < -87.0f;
    x = (f32x4)((i32x4)x & ~dead);
    f32x4 m = x * 1.44269504088896341f;
    m = m + 12582912.0f; /* 1.5 * 2^23: n in the low bits, rounded to nearest */
    const f32x4 n = m - 12582912.0f;
    const f32x4 hi = n * 0.693359375f, lo = n * -2.12194440e-4f;
    f32x4 r = x - hi;
    r = r - lo;
    f32x4 p = r * 1.9875691500e-4f;
    p = p + 1.3981999507e-3f;
    p = p * r;
    p = p + 8.3334519073e-3f;
    p = p * r;
    p = p + 4.1665795894e-2f;
    p = p * r;
    p = p + 1.6666665459e-1f;
    p = p * r;
    p = p + 5.0000001201e-1f;
    const f32x4 r2 = r * r;
    p = p * r2;
    p = p + r;
    p = p + 1.0f;
    i32x4 e = (i32x4)m - 0x4b400000; /* n, from m's bits */
    e = e + 127;
    e = e << 23;
    const f32x4 y = p * (f32x4)e;
    return (f32x4)((i32x4)y & ~dead);
}

float q35_sampler_exp(float x) {
    const f32x4 v = {x};
    return exp4(v)[0];
}

#define SAMPLER_BLOCK 256 /* entries per block sum: the uncut draw walks the blocks, then one block */
#define SAMPLER_BLOCKS(n) (((n) + SAMPLER_BLOCK - 1) / SAMPLER_BLOCK)

#define SAMPLER_BUCKETS 512
#define SAMPLER_BUCKET_SCALE 8.0f

/* The bucket of a logit d below the row's max (d >= 0; inf for -inf): steps of 1 / SAMPLER_BUCKET_SCALE,
 * SAMPLER_BUCKETS past the last step. Non-decreasing in d. */
static inline int logit_bucket(float d) {
    return d < (float)SAMPLER_BUCKETS / SAMPLER_BUCKET_SCALE ? (int)(d * SAMPLER_BUCKET_SCALE) : SAMPLER_BUCKETS;
}

/* The weights e^((l[i] - mx) * inv_t) of l[0..n) into w (NULL: not kept; w may be l) and their sum in
 * double: each block of SAMPLER_BLOCK entries summed in eight partial sums by lane and those in a fixed
 * tree, into blocks[b] unless NULL, the blocks added in order. With mass, each weight also goes to
 * mass[logit_bucket(mx - l[i])] (untempered rows: inv_t 1). */
static double exp_row(float *w, double *blocks, double *mass, const float *l, int32_t n, float mx, float inv_t) {
    double total = 0;
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_BLOCK) {
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const int32_t b1 = n - b0 < SAMPLER_BLOCK ? n : b0 + SAMPLER_BLOCK;
        for (int32_t i = b0; i < b1; i += 8) {
            float v[8], e[8];
            if (b1 - i >= 8) memcpy(v, l + i, sizeof v);
            else
                for (int k = 0; k < 8; k++) v[k] = i + k < b1 ? l[i + k] : -INFINITY;
            for (int h = 0; h < 8; h += 4) {
                f32x4 d;
                memcpy(&d, v + h, sizeof d);
                d = d - mx;
                d = d * inv_t;
                const f32x4 x = exp4(d);
                memcpy(e + h, &x, sizeof x);
            }
            for (int k = 0; k < 8; k++) s[k] += (double)e[k];
            if (w) memcpy(w + i, e, sizeof(float) * (size_t)(b1 - i < 8 ? b1 - i : 8));
            if (mass)
                for (int k = 0; k < 8 && i + k < b1; k++) mass[logit_bucket(mx - v[k])] += (double)e[k];
        }
        const double sb = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        if (blocks) blocks[b0 / SAMPLER_BLOCK] = sb;
        total += sb;
    }
    return total;
}

double q35_sampler_row_sum(const float *logits, int32_t n, float mx) {
    return exp_row(NULL, NULL, NULL, logits, n, mx, 1.0f);
}

q35_status q35_sampler_new(const q35_sampler_params *params, int32_t vocab_size, q35_sampler **out,
                           q35_error *err) {
    *out = NULL;
    if (vocab_size <= 0) return q35_fail(err, Q35_ERR_ARG, "sampler: vocab_size %d", vocab_size);
    const q35_sampler_params *p = params;
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) ||
        !(p->repetition_penalty > 0) || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return q35_fail(err, Q35_ERR_ARG, "sampler: parameter out of range");
    q35_sampler *s = calloc(1, sizeof *s);
    if (!s) return q35_fail(err, Q35_ERR_NOMEM, "sampler: out of memory");
    size_t n = (size_t)vocab_size;
    s->p = *p;
    s->n_vocab = vocab_size;
    s->out_count = calloc(n, sizeof *s->out_count);
    s->out_ids = malloc(n * sizeof *s->out_ids);
    s->in_prompt = calloc(n, 1);
    s->prompt_ids = malloc(n * sizeof *s->prompt_ids);
    s->penalised = calloc(n, 1);
    s->cand = malloc(n * sizeof *s->cand);
    s->block_sums = malloc((size_t)SAMPLER_BLOCKS(vocab_size) * sizeof *s->block_sums);
    if (!s->out_count || !s->out_ids || !s->in_prompt || !s->prompt_ids || !s->penalised || !s->cand ||
        !s->block_sums) {
        q35_sampler_free(s);
        return q35_fail(err, Q35_ERR_NOMEM, "sampler: out of memory for %d candidates", vocab_size);
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return Q35_OK;
}

void q35_sampler_free(q35_sampler *s) {
    if (!s) return;
    free(s->out_count); free(s->out_ids); free(s->in_prompt); free(s->prompt_ids);
    free(s->penalised); free(s->cand); free(s->block_sums);
    free(s);
}

void q35_sampler_set_prompt(q35_sampler *s, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < s->n_prompt_ids; i++) s->in_prompt[s->prompt_ids[i]] = 0;
    s->n_prompt_ids = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = ids[i];
        if (t < 0 || t >= s->n_vocab || s->in_prompt[t]) continue;
        s->in_prompt[t] = 1;
        s->prompt_ids[s->n_prompt_ids++] = t;
    }
}

void q35_sampler_accept(q35_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab) return;
    if (s->out_count[token]++ == 0) s->out_ids[s->n_out_ids++] = token;
}

static void apply_penalties(q35_sampler *s, float *logits) {
    float rp = s->p.repetition_penalty;
    if (rp != 1.0f) {
        /* each token seen in the prompt or the output, once */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? s->out_ids : s->prompt_ids;
            int32_t n = pass ? s->n_out_ids : s->n_prompt_ids;
            for (int32_t i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (s->penalised[t]) continue;
                s->penalised[t] = 1;
                logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp;
            }
        }
        for (int32_t i = 0; i < s->n_prompt_ids; i++) s->penalised[s->prompt_ids[i]] = 0;
        for (int32_t i = 0; i < s->n_out_ids; i++) s->penalised[s->out_ids[i]] = 0;
    }
    if (s->p.presence_penalty != 0 || s->p.frequency_penalty != 0)
        for (int32_t i = 0; i < s->n_out_ids; i++) {
            int32_t t = s->out_ids[i];
            logits[t] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->out_count[t];
        }
}

static int cand_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Moves the k best candidates (by cand_desc) to the front, unordered. */
static void select_top(candidate *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        candidate pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (cand_desc(&c[i], &pivot) < 0) i++;
            while (cand_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) { candidate t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Top-k after the NaN clean-up: V when off. With no top-k, top-p or min-p
 * cut the draw is made straight from the full softmax. */
static int32_t top_k_of(const q35_sampler *s) {
    int32_t V = s->n_vocab;
    return s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
}
static bool uncut(const q35_sampler *s) { return top_k_of(s) == s->n_vocab && s->p.top_p >= 1.0f && s->p.min_p <= 0.0f; }

/* The top-p and min-p cuts of ranked candidates c[0..n) (best first, c[0] the row's max), sum the
 * untempered softmax's sum over the whole row: the survivors' count. reached: whether the cuts fell
 * within the n, so that candidates ranked after them could not change the count (top-p's did, or it is
 * off, or min-p's fell before the n). */
static int32_t cut_tail(const q35_sampler *s, const candidate *c, int32_t n, double sum, bool *reached) {
    const float mx = c[0].logit;
    *reached = true;
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        int32_t i = 0;
        for (; i < n; i++) {
            acc += (double)q35_sampler_exp(c[i].logit - mx) / sum;
            if (acc >= s->p.top_p) break;
        }
        *reached = i < n;
        if (i < n) n = i + 1;
    }
    if (s->p.min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  logit_i - max >= log(min_p) */
        double cut = log((double)s->p.min_p);
        int32_t m = 1;
        while (m < n && (double)(c[m].logit - mx) >= cut) m++;
        if (m < n) *reached = true; /* min-p cut first, wherever top-p would */
        n = m;
    }
    return n;
}

/* Ranks a penalised row's candidates and applies top-k, then top-p and
 * min-p on the untempered distribution: the survivors are s->cand[0..n),
 * best first. n = 0 when even the best is -inf (s->cand[0] is then the
 * choice). The softmax's sum for top-p is over the top-k candidates in rank
 * order, or without top-k over the whole row (exp_row's order). Without top-k only the
 * candidates that can survive are ranked: those less far below the best
 * logit than the bucket (of 1/8 each) where the mass of the buckets before
 * it reaches top_p, plus one bucket, and at least min_p times the best's
 * probability, less a margin; should the cuts not fall among them after all
 * (rounding), the whole row is ranked. */
static int32_t cut_candidates(q35_sampler *s, const float *logits) {
    int32_t V = s->n_vocab, k = top_k_of(s);
    candidate *c = s->cand;
    bool reached;
    if (k == V) {
        const float mx = q35_row_max(logits, V);
        if (mx == -INFINITY) {
            c[0] = (candidate){-INFINITY, 0}; /* the first of equals */
            return 0;
        }
        /* the softmax's sum, and its mass by how far below the max a logit is (SAMPLER_BUCKETS steps of
         * 1 / SAMPLER_BUCKET_SCALE, the last bucket everything further) */
        double mass[SAMPLER_BUCKETS + 1] = {0};
        const double sum = mx < INFINITY ? exp_row(NULL, NULL, mass, logits, V, mx, 1.0f) : NAN;
        /* buckets [0, nb) are ranked: through the one where top-p's mass is reached, and one more (a +inf
         * logit leaves no finite distances: the whole row) */
        int nb = SAMPLER_BUCKETS + 1;
        if (s->p.top_p < 1.0f && mx < INFINITY) {
            double cum = 0;
            for (int b = 0; b < SAMPLER_BUCKETS; b++) {
                cum += mass[b];
                if (cum >= s->p.top_p * sum) {
                    nb = b + 2;
                    break;
                }
            }
        }
        if (mx < INFINITY) {
            const double min_cut = s->p.min_p > 0.0f ? log((double)s->p.min_p) - 1e-3 : -INFINITY;
            int32_t m = 0;
            for (int32_t i = 0; i < V; i++) {
                const float d = mx - logits[i];
                if (logit_bucket(d) < nb && (double)-d >= min_cut) c[m++] = (candidate){logits[i], i};
            }
            qsort(c, (size_t)m, sizeof *c, cand_desc);
            const int32_t n = cut_tail(s, c, m, sum, &reached);
            if (reached || m == V) return n;
        }
        for (int32_t i = 0; i < V; i++) c[i] = (candidate){logits[i], i};
        qsort(c, (size_t)V, sizeof *c, cand_desc);
        return cut_tail(s, c, V, sum, &reached);
    }
    /* top-k: only the buckets that hold the k best are ranked (those after them hold smaller logits) */
    const float mx = q35_row_max(logits, V);
    int nb = SAMPLER_BUCKETS + 1;
    if (mx > -INFINITY) {
        int32_t count[SAMPLER_BUCKETS + 1] = {0}, cum = 0;
        for (int32_t i = 0; i < V; i++) count[logit_bucket(mx - logits[i])]++;
        for (int b = 0; b < SAMPLER_BUCKETS; b++)
            if ((cum += count[b]) >= k) {
                nb = b + 1;
                break;
            }
    }
    int32_t m = 0;
    for (int32_t i = 0; i < V; i++)
        if (nb > SAMPLER_BUCKETS || logit_bucket(mx - logits[i]) < nb) c[m++] = (candidate){logits[i], i};
    select_top(c, m, k);
    qsort(c, (size_t)k, sizeof *c, cand_desc);
    if (c[0].logit == -INFINITY) return 0; /* c[0].logit is mx */
    double sum = 0;
    for (int32_t i = 0; i < k; i++) sum += (double)q35_sampler_exp(c[i].logit - mx);
    return cut_tail(s, c, k, sum, &reached);
}

static void clean_nan(float *logits, int32_t V) { /* NaN never wins and never gets probability */
    int32_t i = 0;
    for (; i + 8 <= V; i += 8) { /* eight at a time: a row seldom has any */
        f32x4 a, b;
        memcpy(&a, logits + i, sizeof a);
        memcpy(&b, logits + i + 4, sizeof b);
        const i32x4 nan = (a != a) | (b != b);
        if (!(nan[0] | nan[1] | nan[2] | nan[3])) continue;
        for (int k = 0; k < 8; k++)
            if (logits[i + k] != logits[i + k]) logits[i + k] = -INFINITY;
    }
    for (; i < V; i++)
        if (logits[i] != logits[i]) logits[i] = -INFINITY;
}

int32_t q35_sampler_sample(q35_sampler *s, float *logits) {
    int32_t V = s->n_vocab;
    apply_penalties(s, logits);
    clean_nan(logits, V);
    if (s->p.temperature <= 0) return q35_argmax(logits, V);

    float inv_t = 1.0f / s->p.temperature;
    if (uncut(s)) {
        /* no cut: draw straight from the tempered softmax, in id order: the block where the draw falls,
         * then the entry within it (the block's last weighted one should rounding leave the walk short) */
        float mx = q35_row_max(logits, V);
        if (mx == -INFINITY) return 0;
        if (mx == INFINITY) return q35_argmax(logits, V); /* all the mass at +inf: the first of them */
        float *w = (float *)s->cand;
        const double sum = exp_row(w, s->block_sums, NULL, logits, V, mx, inv_t);
        double u = rng_uniform(s->rng) * sum, acc = 0;
        int32_t b = 0;
        for (; b < SAMPLER_BLOCKS(V) - 1 && !(u < acc + s->block_sums[b]); b++) acc += s->block_sums[b];
        const int32_t b0 = b * SAMPLER_BLOCK, b1 = V - b0 < SAMPLER_BLOCK ? V : b0 + SAMPLER_BLOCK;
        for (int32_t i = b0; i < b1; i++) {
            acc += w[i];
            if (w[i] > 0 && u < acc) return i;
        }
        /* rounding left the walk short: the last weighted entry up to this block's end (the max's weight
         * is 1, so there is one) */
        int32_t i = b1 - 1;
        while (i > 0 && !(w[i] > 0)) i--;
        return i;
    }

    int32_t n = cut_candidates(s, logits);
    candidate *c = s->cand;
    if (!n) return c[0].id;
    float mx = c[0].logit;
    double tsum = 0;
    for (int32_t i = 0; i < n; i++) tsum += (double)q35_sampler_exp((c[i].logit - mx) * inv_t);
    double u = rng_uniform(s->rng) * tsum, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += (double)q35_sampler_exp((c[i].logit - mx) * inv_t);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

/* Forgets tokens q35_sampler_accept recorded last, newest first: a token
 * whose count drops to 0 is then the last of out_ids. */
static void unaccept(q35_sampler *s, const int32_t *ids, int32_t n) {
    for (int32_t i = n - 1; i >= 0; i--) {
        int32_t t = ids[i];
        if (t < 0 || t >= s->n_vocab) continue;
        if (--s->out_count[t] == 0) s->n_out_ids--;
    }
}

double q35_sampler_uniform(q35_sampler *s) { return rng_uniform(s->rng); }
int32_t q35_sampler_vocab(const q35_sampler *s) { return s->n_vocab; }
bool q35_sampler_is_argmax(const q35_sampler *s) {
    return s->p.temperature <= 0 && s->p.repetition_penalty == 1.0f && s->p.presence_penalty == 0 &&
           s->p.frequency_penalty == 0;
}

int32_t q35_sampler_sample_after(q35_sampler *s, float *logits, const int32_t *prev, int32_t n_prev) {
    for (int32_t i = 0; i < n_prev; i++) q35_sampler_accept(s, prev[i]);
    int32_t t = q35_sampler_sample(s, logits);
    unaccept(s, prev, n_prev);
    return t;
}

static void one_hot(float *probs, int32_t V, int32_t t) {
    for (int32_t i = 0; i < V; i++) probs[i] = 0.0f;
    probs[t] = 1.0f;
}

void q35_sampler_probs(q35_sampler *s, const float *logits, const int32_t *prev, int32_t n_prev, float *probs) {
    int32_t V = s->n_vocab;
    float *l = probs; /* the penalised logits, then the probabilities, in place */
    memcpy(l, logits, sizeof *l * (size_t)V);
    for (int32_t i = 0; i < n_prev; i++) q35_sampler_accept(s, prev[i]);
    apply_penalties(s, l);
    unaccept(s, prev, n_prev);
    clean_nan(l, V);
    if (s->p.temperature <= 0) { one_hot(probs, V, q35_argmax(l, V)); return; }
    float inv_t = 1.0f / s->p.temperature;
    if (uncut(s)) {
        float mx = q35_row_max(l, V);
        if (mx == -INFINITY) { one_hot(probs, V, 0); return; }
        if (mx == INFINITY) { one_hot(probs, V, q35_argmax(l, V)); return; }
        const float inv = (float)(1.0 / exp_row(probs, NULL, NULL, l, V, mx, inv_t));
        for (int32_t i = 0; i < V; i++) probs[i] *= inv;
        return;
    }
    int32_t n = cut_candidates(s, l);
    candidate *c = s->cand;
    if (!n) { one_hot(probs, V, c[0].id); return; }
    float mx = c[0].logit;
    double tsum = 0;
    for (int32_t i = 0; i < n; i++) tsum += (double)q35_sampler_exp((c[i].logit - mx) * inv_t);
    for (int32_t i = 0; i < V; i++) probs[i] = 0.0f;
    for (int32_t i = 0; i < n; i++) probs[c[i].id] = (float)((double)q35_sampler_exp((c[i].logit - mx) * inv_t) / tsum);
}

float q35_logprobs(const float *logits, int32_t n, int32_t token, int32_t k, int32_t *top_ids,
                   float *top_logprobs) {
    const float mx = q35_row_max(logits, n);
    const float lse = mx + (float)log(q35_sampler_row_sum(logits, n, mx));
    if (k > n) k = n;
    /* insertion into a small sorted list: k is at most a few dozen */
    int32_t have = 0;
    for (int32_t i = 0; k > 0 && i < n; i++) {
        float v = logits[i];
        if (have == k && !(v > logits[top_ids[k - 1]])) continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && v > logits[top_ids[j - 1]]) { top_ids[j] = top_ids[j - 1]; j--; }
        top_ids[j] = i;
    }
    for (int32_t j = 0; j < have; j++) top_logprobs[j] = logits[top_ids[j]] - lse;
    return token >= 0 && token < n ? logits[token] - lse : -INFINITY;
}
