/* Loading a Hugging Face tokenizer.json into the tables of internal.h, plus the small
 * accessors. Every unsupported or malformed part is an error naming the file and the JSON path;
 * encoding is in encode.c, decoding in decode.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "kernels/base/error.h"
#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

#define TOKENIZER_MAX_ID (1 << 24) /* ids index dense tables */

/* ---- model ------------------------------------------------------------------------------- */

static int merge_insert(zr_tokenizer *tok, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) & tok->merge_mask;
    while (tok->merge_keys[h] != UINT64_MAX && tok->merge_keys[h] != key)
        h = (h + 1) & tok->merge_mask;
    tok->merge_keys[h] = key; /* a repeated pair keeps the later rank, as HF's HashMap does */
    tok->merge_rank[h] = rank;
    tok->merge_new[h] = new_id;
    return 0;
}

static int32_t vocab_id(const zr_tokenizer *tok, const char *s, int64_t n) {
    int64_t e = tok_strmap_find(&tok->vocab, s, n);
    return e < 0 ? -1 : tok->vocab.e[e].a;
}

static int load_merges(zr_tokenizer *tok, const zr_json *merges) {
    const char *P = tok->path;
    int64_t n = zr_json_len(merges);
    if (merges && !zr_json_is(merges, ZR_JSON_ARRAY))
        return zr_error("%s: model.merges must be an array, got %s", P, zr_json_type_name(merges));
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n + 2)
        size *= 2;
    tok->merge_keys = malloc(size * sizeof *tok->merge_keys);
    tok->merge_rank = malloc(size * sizeof *tok->merge_rank);
    tok->merge_new = malloc(size * sizeof *tok->merge_new);
    if (!tok->merge_keys || !tok->merge_rank || !tok->merge_new)
        return zr_error("%s: out of memory for %lld merges", P, (long long)n);
    memset(tok->merge_keys, 0xFF, size * sizeof *tok->merge_keys);
    tok->merge_mask = size - 1;
    size_t pre_n = tok->cont_prefix ? strlen(tok->cont_prefix) : 0;
    tok_buf joined = {0};
    for (int64_t i = 0; i < n; i++) {
        const zr_json *m = zr_json_at(merges, i);
        const char *a, *b;
        int64_t an, bn;
        if (zr_json_is(m, ZR_JSON_STRING)) { /* legacy "a b" */
            const char *sp = memchr(m->u.str, ' ', (size_t)m->len);
            if (!sp) {
                free(joined.v);
                return zr_error("%s: model.merges[%lld] \"%s\" has no space between its two "
                                "tokens",
                                P, (long long)i, m->u.str);
            }
            a = m->u.str, an = sp - a, b = sp + 1, bn = m->len - an - 1;
        } else if (zr_json_len(m) == 2 && zr_json_is(m, ZR_JSON_ARRAY) &&
                   zr_json_is(zr_json_at(m, 0), ZR_JSON_STRING) &&
                   zr_json_is(zr_json_at(m, 1), ZR_JSON_STRING)) {
            a = zr_json_at(m, 0)->u.str, an = zr_json_at(m, 0)->len;
            b = zr_json_at(m, 1)->u.str, bn = zr_json_at(m, 1)->len;
        } else {
            free(joined.v);
            return zr_error("%s: model.merges[%lld] is not a string or pair of strings", P,
                            (long long)i);
        }
        int32_t ia = vocab_id(tok, a, an), ib = vocab_id(tok, b, bn);
        joined.n = 0;
        size_t skip = (size_t)bn >= pre_n ? pre_n : (size_t)bn;
        if (tok_buf_append(&joined, a, an) ||
            tok_buf_append(&joined, b + skip, bn - (int64_t)skip)) {
            free(joined.v);
            return zr_error("%s: out of memory", P);
        }
        int32_t inew = vocab_id(tok, joined.v, joined.n);
        if (ia < 0 || ib < 0 || inew < 0) {
            const char *which = ia < 0 ? a : ib < 0 ? b : joined.v;
            int wn = (int)(ia < 0 ? an : ib < 0 ? bn : joined.n);
            zr_error("%s: model.merges[%lld] uses \"%.*s\", which is not in model.vocab", P,
                     (long long)i, wn, which);
            free(joined.v);
            return ZR_ERR;
        }
        merge_insert(tok, ia, ib, (int32_t)i, inew);
    }
    free(joined.v);
    return 0;
}

static const char *opt_string(const zr_json *obj, const char *key) {
    const char *s = zr_json_get_string(obj, key, NULL);
    return s && *s ? s : NULL;
}

/* "a number with a fraction or exponent", "-3", "string", ... for messages about ids */
static void describe_id(const zr_json *v, char *buf, size_t cap) {
    if (!zr_json_is(v, ZR_JSON_NUMBER))
        snprintf(buf, cap, "%s", zr_json_type_name(v));
    else if (v->is_int_literal)
        snprintf(buf, cap, "%lld", (long long)v->u.n.i);
    else
        snprintf(buf, cap, "%.17g", v->u.n.num);
}

static int load_model(zr_tokenizer *tok, const zr_json *model) {
    const char *P = tok->path;
    if (!zr_json_is(model, ZR_JSON_OBJECT))
        return zr_error("%s: \"model\" must be an object, got %s", P, zr_json_type_name(model));
    /* the old serialization (GPT-2) has no "type"; then it is BPE */
    const char *type = zr_json_get_string(model, "type", "BPE");
    if (strcmp(type, "BPE") != 0)
        return zr_error("%s: model.type \"%s\" is not supported (only BPE)", P, type);
    const zr_json *vocab = zr_json_get(model, "vocab");
    if (!zr_json_is(vocab, ZR_JSON_OBJECT))
        return zr_error("%s: model.vocab must be an object of token -> id, got %s", P,
                        zr_json_type_name(vocab));
    double dropout = zr_json_get_number(model, "dropout", 0.0);
    if (dropout > 0.0)
        return zr_error("%s: model.dropout %g is not supported (use null or 0)", P, dropout);
    const char *pre = opt_string(model, "continuing_subword_prefix");
    const char *suf = opt_string(model, "end_of_word_suffix");
    if ((pre && !(tok->cont_prefix = strdup(pre))) || (suf && !(tok->eow_suffix = strdup(suf))))
        return zr_error("%s: out of memory", P);
    int64_t nv = zr_json_len(vocab), max_id = -1;
    for (int64_t i = 0; i < nv; i++) {
        const zr_json_member *m = zr_json_member_at(vocab, i);
        if (!m->value.is_int_literal || m->value.u.n.i < 0 || m->value.u.n.i >= TOKENIZER_MAX_ID) {
            char got[32];
            describe_id(&m->value, got, sizeof got);
            return zr_error("%s: model.vocab[\"%s\"] must be an integer id from 0 to 2^24-1, got %s",
                            P, m->key, got);
        }
        if (tok_strmap_put(&tok->vocab, m->key, m->key_len, (int32_t)m->value.u.n.i, 0) < 0)
            return zr_error("%s: out of memory", P);
        if (m->value.u.n.i > max_id) max_id = m->value.u.n.i;
    }
    tok->n_ids = max_id + 1;
    tok->id_entry = malloc((size_t)(tok->n_ids + 1) * sizeof *tok->id_entry);
    if (!tok->id_entry) return zr_error("%s: out of memory", P);
    for (int64_t i = 0; i < tok->n_ids; i++)
        tok->id_entry[i] = -1;
    for (int64_t e = 0; e < tok->vocab.n; e++)
        tok->id_entry[tok->vocab.e[e].a] = e;
    for (int i = 0; i < 0x800; i++)
        tok->char_ids[i] = -1;
    for (int64_t e = 0; e < tok->vocab.n; e++) {
        const char *s = tok_strmap_key(&tok->vocab, e);
        int cl;
        uint32_t cp = tok_utf8_decode(s, &cl);
        if ((uint32_t)cl == tok->vocab.e[e].len && cp < 0x800)
            tok->char_ids[cp] = tok->vocab.e[e].a;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = vocab_id(tok, name, 6);
    }
    const char *unk = zr_json_get_string(model, "unk_token", NULL);
    tok->unk_id = unk ? vocab_id(tok, unk, (int64_t)strlen(unk)) : -1;
    tok->fuse_unk = zr_json_get_bool(model, "fuse_unk", 0);
    tok->byte_fallback = zr_json_get_bool(model, "byte_fallback", 0);
    tok->ignore_merges = zr_json_get_bool(model, "ignore_merges", 0);
    /* SentencePiece-style vocabs never hold a token with "▁" after another char, so no merge
     * crosses such a boundary and long words (a whole line) can be merged piece by piece. */
    tok->split_metaspace = !tok->ignore_merges && !tok->cont_prefix && !tok->eow_suffix &&
                           vocab_id(tok, "\xE2\x96\x81", 3) >= 0;
    for (int64_t e = 0; e < tok->vocab.n && tok->split_metaspace; e++) {
        /* within the key's own bytes (an empty key's terminator is the last byte it owns: a search
         * from one past it read the next key, or past the pool at the last one) */
        const char *s = tok_strmap_key(&tok->vocab, e), *end = s + tok->vocab.e[e].len;
        for (const char *h = s + 1; h < end && (h = memmem(h, (size_t)(end - h), "\xE2\x96\x81", 3)); h++)
            if (h - s < 3 || memcmp(h - 3, "\xE2\x96\x81", 3)) {
                tok->split_metaspace = 0;
                break;
            }
    }
    return load_merges(tok, zr_json_get(model, "merges"));
}

/* ---- added tokens ------------------------------------------------------------------------ */

static int trie_add(tok_trie *t, const char *s, int64_t n, int32_t token) {
    if (!t->nodes) {
        t->cap = 64;
        if (!(t->nodes = malloc((size_t)t->cap * sizeof *t->nodes))) return -1;
        t->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
        t->n = 1;
    }
    if (n == 0) return 0;
    t->first[(unsigned char)s[0]] = 1;
    int32_t node = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != (uint8_t)s[i])
            c = t->nodes[c].sibling;
        if (c < 0) {
            if (t->n == t->cap) {
                tok_trie_node *nn = realloc(t->nodes, (size_t)t->cap * 2 * sizeof *nn);
                if (!nn) return -1;
                t->nodes = nn;
                t->cap *= 2;
            }
            c = (int32_t)t->n++;
            t->nodes[c] = (tok_trie_node){-1, t->nodes[node].child, -1, (uint8_t)s[i]};
            t->nodes[node].child = c;
        }
        node = c;
    }
    if (t->nodes[node].token < 0) t->nodes[node].token = token; /* first of duplicates wins */
    t->empty = 0;
    return 0;
}

static int load_added(zr_tokenizer *tok, const zr_json *arr) {
    const char *P = tok->path;
    if (arr && !zr_json_is(arr, ZR_JSON_ARRAY))
        return zr_error("%s: added_tokens must be an array, got %s", P, zr_json_type_name(arr));
    int64_t n = zr_json_len(arr), pool = 0;
    for (int64_t i = 0; i < n; i++)
        pool += zr_json_len(zr_json_get(zr_json_at(arr, i), "content")) + 1;
    tok->added = calloc((size_t)n + 1, sizeof *tok->added);
    tok->added_pool = malloc((size_t)pool + 1);
    if (!tok->added || !tok->added_pool) return zr_error("%s: out of memory", P);
    /* HF ignores the "id" written in the file: a token in the model vocab keeps its vocab id,
     * any other gets the next id after the vocab and the added tokens so far (the same ids
     * whenever the file is consistent, which real files are). */
    int64_t off = 0, vocab_n = tok->vocab.n, max_id = -1;
    for (int64_t i = 0; i < n; i++) {
        const zr_json *t = zr_json_at(arr, i);
        const zr_json *content = zr_json_get(t, "content");
        if (!zr_json_is(content, ZR_JSON_STRING))
            return zr_error("%s: added_tokens[%lld] needs a string \"content\"", P, (long long)i);
        /* HF reads "id" as a u32 and only warns when it differs from the id it assigns; an id
         * no int32 holds (negative, too large, 3.0, missing) is refused, not renumbered. */
        const zr_json *fid = zr_json_get(t, "id");
        if (!zr_json_is(fid, ZR_JSON_NUMBER) || !fid->is_int_literal || fid->u.n.i < 0 ||
            fid->u.n.i > INT32_MAX) {
            char got[32];
            describe_id(fid, got, sizeof got);
            return zr_error("%s: added_tokens[%lld] (\"%s\") has id %s; an id must be an integer "
                            "from 0 to 2147483647",
                            P, (long long)i, content->u.str, got);
        }
        if (tok_strmap_find(&tok->added_map, content->u.str, content->len) >= 0) continue;
        tok_added *a = &tok->added[tok->n_added];
        int64_t id = vocab_id(tok, content->u.str, content->len);
        if (id < 0)
            id = max_id < 0 ? vocab_n : (max_id >= vocab_n || vocab_n == 0) ? max_id + 1 : vocab_n;
        if (id >= TOKENIZER_MAX_ID)
            return zr_error("%s: added_tokens[%lld] would get id %lld, more than 2^24", P,
                            (long long)i, (long long)id);
        if (id > max_id) max_id = id;
        a->id = (int32_t)id;
        a->special = (uint8_t)zr_json_get_bool(t, "special", 0);
        a->lstrip = (uint8_t)zr_json_get_bool(t, "lstrip", 0);
        a->rstrip = (uint8_t)zr_json_get_bool(t, "rstrip", 0);
        a->single_word = (uint8_t)zr_json_get_bool(t, "single_word", 0);
        a->normalized = (uint8_t)zr_json_get_bool(t, "normalized", !a->special);
        a->off = (uint32_t)off, a->len = (uint32_t)content->len;
        memcpy(tok->added_pool + off, content->u.str, (size_t)content->len + 1);
        off += content->len + 1;
        if (tok_strmap_put(&tok->added_map, content->u.str, content->len, (int32_t)tok->n_added,
                           0) < 0)
            return zr_error("%s: out of memory", P);
        tok->n_added++;
    }
    return 0;
}

/* Tries are built after the normalizers: a "normalized" token is matched in normalized text. */
static int build_tries(zr_tokenizer *tok) {
    tok_buf nb = {0};
    int rc = trie_add(&tok->trie_raw, "", 0, -1) || trie_add(&tok->trie_norm, "", 0, -1);
    for (int64_t i = 0; !rc && i < tok->n_added; i++) {
        const tok_added *a = &tok->added[i];
        const char *s = tok->added_pool + a->off;
        if (!a->normalized || !tok->n_norm) {
            rc = trie_add(a->normalized ? &tok->trie_norm : &tok->trie_raw, s, a->len, (int32_t)i);
        } else {
            nb.n = 0;
            rc = tok_normalize(tok, s, a->len, &nb) ||
                 trie_add(&tok->trie_norm, nb.v, nb.n, (int32_t)i);
        }
        if (!rc && a->single_word && !tok->re_word) {
            int err;
            PCRE2_SIZE eo;
            tok->re_word = pcre2_compile((PCRE2_SPTR) "^\\w", PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
            rc = !tok->re_word;
        }
    }
    free(nb.v);
    return rc ? zr_error("%s: out of memory building the added-token tries", tok->path) : 0;
}

/* ---- special ids ------------------------------------------------------------------------- */

static int32_t token_id_any(const zr_tokenizer *tok, const char *s) {
    return s ? zr_tokenizer_token_to_id(tok, s) : -1;
}

static int32_t config_token(const zr_tokenizer *tok, const zr_json *cfg, const char *key) {
    const zr_json *v = zr_json_get(cfg, key);
    if (zr_json_is(v, ZR_JSON_OBJECT)) v = zr_json_get(v, "content");
    return zr_json_is(v, ZR_JSON_STRING) ? token_id_any(tok, v->u.str) : -1;
}

static int32_t first_known(const zr_tokenizer *tok, const char *const *names) {
    for (; *names; names++) {
        int32_t id = token_id_any(tok, *names);
        if (id >= 0) return id;
    }
    return -1;
}

/* A JSON file beside tok's tokenizer.json (NULL when absent; a broken optional file is NULL too). */
static zr_json_doc *beside(const zr_tokenizer *tok, const char *name) {
    const char *slash = strrchr(tok->path, '/');
    char *p = NULL;
    if (asprintf(&p, "%.*s%s", slash ? (int)(slash - tok->path + 1) : 0, tok->path, name) < 0) return NULL;
    FILE *f = fopen(p, "rb");
    zr_json_doc *d = NULL;
    if (f) {
        fclose(f);
        if (!(d = zr_json_parse_file(p))) zr_clear_error();
    }
    free(p);
    return d;
}

/* Each of bos/eos/pad given by a file's key (kept otherwise). */
static void special_ids_from(zr_tokenizer *tok, const zr_json *cfg) {
    int32_t id;
    if ((id = config_token(tok, cfg, "bos_token")) >= 0) tok->bos = id;
    if ((id = config_token(tok, cfg, "eos_token")) >= 0) tok->eos = id;
    if ((id = config_token(tok, cfg, "pad_token")) >= 0) tok->pad = id;
}

static void find_special_ids(zr_tokenizer *tok) {
    static const char *const bos[] = {"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>", NULL};
    static const char *const eos[] = {"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", NULL};
    static const char *const pad[] = {"<pad>", "<|pad|>", "[PAD]", NULL};
    tok->bos = tok->eos = tok->pad = -1;
    /* tokenizer_config.json (transformers) knows best; it is optional. Without "added_tokens_decoder" (saved
     * before transformers 4.34) transformers 5 reads special_tokens_map.json too, whose keys win. */
    zr_json_doc *cfg = beside(tok, "tokenizer_config.json");
    int configured = cfg != NULL, legacy = !cfg || !zr_json_get(zr_json_root(cfg), "added_tokens_decoder");
    if (cfg) {
        special_ids_from(tok, zr_json_root(cfg));
        const char *side = zr_json_get_string(zr_json_root(cfg), "truncation_side", NULL);
        if (side) tok->truncate_left = !strcmp(side, "left");
        zr_json_doc_free(cfg);
    }
    zr_json_doc *map = legacy ? beside(tok, "special_tokens_map.json") : NULL;
    if (map) {
        configured = 1;
        special_ids_from(tok, zr_json_root(map));
        zr_json_doc_free(map);
    }
    int64_t seq = -1;
    for (int64_t i = 0; i < tok->n_tmpl; i++)
        if (tok->tmpl[i].is_sequence) seq = i;
    if (tok->bos < 0 && seq > 0 && tok->tmpl[0].n) tok->bos = tok->tmpl[0].ids[0];
    if (tok->eos < 0 && seq >= 0 && seq + 1 < tok->n_tmpl && tok->tmpl[seq + 1].n)
        tok->eos = tok->tmpl[seq + 1].ids[0];
    if (tok->bos < 0) tok->bos = first_known(tok, bos);
    if (tok->eos < 0) tok->eos = first_known(tok, eos);
    if (tok->pad < 0 && !configured) tok->pad = first_known(tok, pad); /* (transformers: none unless a file names it) */
}

/* Each frees one part of the pipeline, leaving it empty. */
static void free_normalizers(zr_tokenizer *tok) {
    for (int64_t i = 0; i < tok->n_norm; i++)
        free(tok->norm[i].a), free(tok->norm[i].b);
    free(tok->norm);
    tok->norm = NULL, tok->n_norm = 0;
}
static void free_pretoks(zr_tokenizer *tok) {
    for (int64_t i = 0; i < tok->n_pre; i++)
        pcre2_code_free(tok->pre[i].re);
    free(tok->pre);
    tok->pre = NULL, tok->n_pre = 0;
}
static void free_decoders(zr_tokenizer *tok) {
    for (int64_t i = 0; i < tok->n_dec; i++)
        free(tok->dec[i].a), free(tok->dec[i].b);
    free(tok->dec);
    tok->dec = NULL, tok->n_dec = 0, tok->has_decoder = 0;
}

/* Normalized added tokens are matched in normalized text: the tries follow a new normalizer. */
static int rebuild_tries(zr_tokenizer *tok) {
    free(tok->trie_raw.nodes), free(tok->trie_norm.nodes);
    memset(&tok->trie_raw, 0, sizeof tok->trie_raw), memset(&tok->trie_norm, 0, sizeof tok->trie_norm);
    return build_tries(tok);
}

/* ---- public ------------------------------------------------------------------------------ */

zr_tokenizer *zr_tokenizer_load(const char *path) {
    tok_bytelevel_init();
    zr_json_doc *doc = zr_json_parse_file(path);
    if (!doc) return NULL;
    zr_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->path = strdup(path))) {
        free(tok);
        zr_json_doc_free(doc);
        return zr_error_null("%s: out of memory", path);
    }
    pthread_mutex_init(&tok->cache_lock, NULL);
    const zr_json *root = zr_json_root(doc);
    int rc = ZR_ERR;
    if (!zr_json_is(root, ZR_JSON_OBJECT))
        zr_error("%s: the top level must be an object, got %s", path, zr_json_type_name(root));
    else if (!load_model(tok, zr_json_get(root, "model")) &&
             !load_added(tok, zr_json_get(root, "added_tokens")) &&
             !tok_load_normalizer(tok, zr_json_get(root, "normalizer"), "normalizer") &&
             !build_tries(tok) && !tok_load_pretok(tok, zr_json_get(root, "pre_tokenizer")) &&
             !tok_load_post(tok, zr_json_get(root, "post_processor")) &&
             !tok_load_decoder(tok, zr_json_get(root, "decoder")))
        rc = ZR_OK;
    /* the side truncation cuts (tokenizer_config.json's truncation_side overrides it, as in transformers) */
    tok->truncate_left = !strcmp(zr_json_get_string(zr_json_get(root, "truncation"), "direction", "Right"), "Left");
    zr_json_doc_free(doc);
    if (rc) {
        zr_tokenizer_free(tok);
        return NULL;
    }
    tok->vocab_size = tok->n_ids;
    for (int64_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id >= tok->vocab_size) tok->vocab_size = tok->added[i].id + 1;
    if (!(tok->added_by_id = malloc((size_t)tok->vocab_size * sizeof(int32_t)))) {
        zr_tokenizer_free(tok);
        return zr_error_null("%s: out of memory", path);
    }
    for (int64_t i = 0; i < tok->vocab_size; i++)
        tok->added_by_id[i] = -1;
    for (int64_t i = tok->n_added - 1; i >= 0; i--)
        tok->added_by_id[tok->added[i].id] = (int32_t)i;
    find_special_ids(tok);
    return tok;
}

void zr_tokenizer_free(zr_tokenizer *tok) {
    if (!tok) return;
    free(tok->path);
    tok_strmap_free(&tok->vocab);
    free(tok->id_entry);
    free(tok->merge_keys), free(tok->merge_rank), free(tok->merge_new);
    free(tok->cont_prefix), free(tok->eow_suffix);
    pthread_mutex_destroy(&tok->cache_lock);
    tok_strmap_free(&tok->cache);
    free(tok->cache_ids.v);
    free(tok->added), free(tok->added_pool), free(tok->added_by_id);
    tok_strmap_free(&tok->added_map);
    free(tok->trie_raw.nodes), free(tok->trie_norm.nodes);
    pcre2_code_free(tok->re_word);
    free_normalizers(tok);
    free_pretoks(tok);
    for (int64_t i = 0; i < tok->n_tmpl; i++)
        free(tok->tmpl[i].ids);
    free(tok->tmpl);
    free_decoders(tok);
    free(tok);
}

_Static_assert((int)ZR_PREPEND_ALWAYS == (int)PREPEND_ALWAYS && (int)ZR_PREPEND_FIRST == (int)PREPEND_FIRST &&
                   (int)ZR_PREPEND_NEVER == (int)PREPEND_NEVER,
               "the public prepend schemes are the internal ones");

int zr_tokenizer_use_metaspace(zr_tokenizer *tok, int prepend_scheme) {
    if (prepend_scheme < ZR_PREPEND_ALWAYS || prepend_scheme > ZR_PREPEND_NEVER)
        return zr_error("%s: prepend scheme %d is not always (0), first (1) or never (2)", tok->path,
                        prepend_scheme);
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return zr_error("%s: out of memory", tok->path);
    free_normalizers(tok);
    free_pretoks(tok);
    p->kind = PRE_METASPACE;
    memcpy(p->repl, "\xE2\x96\x81", 3);
    p->repl_len = 3;
    p->prepend_scheme = prepend_scheme;
    p->split = 0;
    tok->pre = p, tok->n_pre = 1;
    /* and its decoder: "▁" -> " ", ByteFallback, Fuse, then the first space stripped unless none was prepended */
    tok_decoder *d = calloc(4, sizeof *d);
    char *a = strdup("\xE2\x96\x81"), *b = strdup(" ");
    if (!d || !a || !b) {
        free(d), free(a), free(b);
        return zr_error("%s: out of memory", tok->path);
    }
    free_decoders(tok);
    d[0] = (tok_decoder){.kind = DEC_REPLACE, .a = a, .alen = 3, .b = b, .blen = 1};
    d[1].kind = DEC_BYTEFALLBACK, d[2].kind = DEC_FUSE;
    d[3] = (tok_decoder){.kind = DEC_STRIP, .strip_char = ' ', .start = 1};
    tok->dec = d, tok->n_dec = prepend_scheme == ZR_PREPEND_NEVER ? 3 : 4, tok->has_decoder = 1;
    return rebuild_tries(tok);
}

/* Moves the parts src loaded (those named in the pipeline object: has[0..2] for normalizer,
 * pre-tokenizer, decoder) into tok, freeing tok's. */
static void move_pipeline(zr_tokenizer *tok, zr_tokenizer *src, const int has[3]) {
    if (has[0]) free_normalizers(tok), tok->norm = src->norm, tok->n_norm = src->n_norm;
    if (has[1]) free_pretoks(tok), tok->pre = src->pre, tok->n_pre = src->n_pre;
    if (has[2]) {
        free_decoders(tok);
        tok->dec = src->dec, tok->n_dec = src->n_dec, tok->has_decoder = src->has_decoder;
    }
}

int zr_tokenizer_set_pipeline(zr_tokenizer *tok, const char *json, size_t len) {
    zr_json_doc *doc = zr_json_parse(json, (int64_t)len, "tokenizer pipeline");
    if (!doc) return ZR_ERR;
    const zr_json *root = zr_json_root(doc), *norm = zr_json_get(root, "normalizer"),
                  *pre = zr_json_get(root, "pre_tokenizer"), *dec = zr_json_get(root, "decoder");
    /* loaded into a scratch tokenizer first: a part it refuses leaves tok as it was */
    zr_tokenizer *src = calloc(1, sizeof *src);
    int rc = ZR_ERR, has[3] = {norm != NULL, pre != NULL, dec != NULL};
    if (!src)
        zr_error("%s: out of memory", tok->path);
    else if (!zr_json_is(root, ZR_JSON_OBJECT))
        zr_error("%s: a pipeline must be a JSON object with \"normalizer\", \"pre_tokenizer\" and/or "
                 "\"decoder\" (as in tokenizer.json), got %s",
                 tok->path, zr_json_type_name(root));
    else {
        src->path = tok->path; /* (borrowed: the parts' messages name the file) */
        rc = tok_load_normalizer(src, norm, "normalizer") || tok_load_pretok(src, pre) ||
                     tok_load_decoder(src, dec)
                 ? ZR_ERR
                 : ZR_OK;
    }
    zr_json_doc_free(doc);
    if (rc) {
        if (src) free_normalizers(src), free_pretoks(src), free_decoders(src);
        free(src);
        return ZR_ERR;
    }
    move_pipeline(tok, src, has);
    free(src);
    return has[0] ? rebuild_tries(tok) : ZR_OK;
}

void zr_tokenizer_set_add_prefix_space(zr_tokenizer *tok, int on) {
    for (int64_t i = 0; i < tok->n_pre; i++)
        if (tok->pre[i].kind == PRE_BYTELEVEL) tok->pre[i].add_prefix_space = on;
}

int64_t zr_tokenizer_vocab_size(const zr_tokenizer *tok) {
    return tok->vocab_size;
}

int32_t zr_tokenizer_token_to_id(const zr_tokenizer *tok, const char *token) {
    int64_t n = (int64_t)strlen(token), e = tok_strmap_find(&tok->added_map, token, n);
    if (e >= 0) return tok->added[tok->added_map.e[e].a].id;
    return vocab_id(tok, token, n);
}

const char *zr_tokenizer_id_to_token(const zr_tokenizer *tok, int32_t id, int64_t *len) {
    int32_t a = id >= 0 && id < tok->vocab_size ? tok->added_by_id[id] : -1;
    if (a >= 0) {
        if (len) *len = tok->added[a].len;
        return tok->added_pool + tok->added[a].off;
    }
    if (id < 0 || id >= tok->n_ids || tok->id_entry[id] < 0) return NULL;
    const tok_entry *e = &tok->vocab.e[tok->id_entry[id]];
    if (len) *len = e->len;
    return tok->vocab.pool + e->off;
}

int32_t zr_tokenizer_bos_id(const zr_tokenizer *tok) {
    return tok->bos;
}
int32_t zr_tokenizer_eos_id(const zr_tokenizer *tok) {
    return tok->eos;
}
int32_t zr_tokenizer_pad_id(const zr_tokenizer *tok) {
    return tok->pad;
}

int zr_tokenizer_truncate(const zr_tokenizer *tok, int32_t *ids, int64_t *n, int64_t max_length,
                          int add_special_tokens) {
    if (*n <= max_length) return ZR_OK;
    int64_t sp = 0, before = -1; /* the post-processor's ids: sp in all, before of them ahead of the text */
    for (int64_t i = 0; add_special_tokens && i < tok->n_tmpl; i++) {
        if (!tok->tmpl[i].is_sequence) sp += tok->tmpl[i].n;
        else if (before < 0) before = sp;
    }
    if (before < 0) before = sp;
    if (max_length < sp)
        return zr_error("max_length %lld is less than the %lld special tokens the tokenizer adds",
                        (long long)max_length, (long long)sp);
    int64_t after = sp - before, keep = max_length - sp, text = *n - sp;
    if (tok->truncate_left) memmove(ids + before, ids + before + text - keep, sizeof *ids * (size_t)keep);
    memmove(ids + before + keep, ids + *n - after, sizeof *ids * (size_t)after);
    *n = max_length;
    return ZR_OK;
}

int zr_tokenizer_is_special(const zr_tokenizer *tok, int32_t id) {
    int32_t a = id >= 0 && id < tok->vocab_size ? tok->added_by_id[id] : -1;
    return a >= 0 && tok->added[a].special;
}

#else /* no PCRE2: every entry point reports it */

zr_tokenizer *zr_tokenizer_load(const char *path) {
    return zr_error_null("%s: zrun was built without PCRE2 (install libpcre2-dev and rebuild)",
                         path);
}
void zr_tokenizer_free(zr_tokenizer *tok) {
    (void)tok;
}
int zr_tokenizer_use_metaspace(zr_tokenizer *tok, int prepend_scheme) {
    (void)tok, (void)prepend_scheme;
    return zr_error("tokenizer: zrun was built without PCRE2");
}
int zr_tokenizer_encode(const zr_tokenizer *tok, const char *text, size_t len,
                        int add_special_tokens, int32_t **ids, int64_t *n) {
    (void)tok, (void)text, (void)len, (void)add_special_tokens, (void)ids, (void)n;
    return zr_error("tokenizer: zrun was built without PCRE2");
}
int zr_tokenizer_decode_len(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                            int skip_special_tokens, char **out, int64_t *len) {
    (void)tok, (void)ids, (void)n, (void)skip_special_tokens, (void)out, (void)len;
    return zr_error("tokenizer: zrun was built without PCRE2");
}
int zr_tokenizer_decode(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                        int skip_special_tokens, char **out) {
    return zr_tokenizer_decode_len(tok, ids, n, skip_special_tokens, out, NULL);
}
void zr_tokenizer_set_add_prefix_space(zr_tokenizer *tok, int on) {
    (void)tok, (void)on;
}
int zr_tokenizer_set_pipeline(zr_tokenizer *tok, const char *json, size_t len) {
    (void)tok, (void)json, (void)len;
    return zr_error("tokenizer: zrun was built without PCRE2");
}
int64_t zr_tokenizer_vocab_size(const zr_tokenizer *tok) {
    return (void)tok, 0;
}
int32_t zr_tokenizer_token_to_id(const zr_tokenizer *tok, const char *token) {
    return (void)tok, (void)token, -1;
}
const char *zr_tokenizer_id_to_token(const zr_tokenizer *tok, int32_t id, int64_t *len) {
    return (void)tok, (void)id, (void)len, NULL;
}
int32_t zr_tokenizer_bos_id(const zr_tokenizer *tok) {
    return (void)tok, -1;
}
int32_t zr_tokenizer_eos_id(const zr_tokenizer *tok) {
    return (void)tok, -1;
}
int32_t zr_tokenizer_pad_id(const zr_tokenizer *tok) {
    return (void)tok, -1;
}
int zr_tokenizer_truncate(const zr_tokenizer *tok, int32_t *ids, int64_t *n, int64_t max_length,
                          int add_special_tokens) {
    (void)tok, (void)ids, (void)n, (void)max_length, (void)add_special_tokens;
    return zr_error("tokenizer: zrun was built without PCRE2");
}
int zr_tokenizer_is_special(const zr_tokenizer *tok, int32_t id) {
    return (void)tok, (void)id, 0;
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
