/* Hugging Face tokenizer.json tokenizers in C, giving the same ids as the Rust `tokenizers`
 * library for BPE models: GPT-2 / Llama-3 byte-level BPE (ByteLevel and regex Split
 * pre-tokenizers) and SentencePiece-style BPE (Llama-2, TinyLlama: Prepend/Replace normalizers or
 * Metaspace, byte_fallback, fuse_unk), with added/special tokens, TemplateProcessing and decoding.
 * Not supported (load fails with a message): WordPiece/Unigram/WordLevel models, Unicode
 * normalization forms (NFC, NFKC, ...), Bert-style pre-tokenizers, dropout, truncation/padding.
 *
 *   zr_tokenizer *tok = zr_tokenizer_load("tokenizer.json");     // NULL + zr_last_error()
 *   int32_t *ids; int64_t n;
 *   if (zr_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n) == ZR_OK) { ...; free(ids); }
 *   char *s; zr_tokenizer_decode(tok, ids, n, 1, &s); ...; free(s);
 *   zr_tokenizer_free(tok);
 *
 * A loaded tokenizer is read-only except for an internal word cache behind a mutex, so one
 * tokenizer may be used by several threads at once.
 */
#ifndef ZR_TOKENIZER_H
#define ZR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct zr_tokenizer zr_tokenizer;

/* Loads a tokenizer.json. bos/eos/pad ids come from a tokenizer_config.json next to it (and, when that
 * has no "added_tokens_decoder", a special_tokens_map.json, whose keys win: transformers 5's reading),
 * else bos/eos from the post-processor and well-known token names; pad from a well-known name only when
 * neither file is there (transformers: none). */
zr_tokenizer *zr_tokenizer_load(const char *path);
void zr_tokenizer_free(zr_tokenizer *tok);

/* Encodes text[0..len) (UTF-8; invalid UTF-8 is an error) into *ids (malloc'd, caller frees)
 * and *n. add_special_tokens applies the post-processor (e.g. prepends <s>); special tokens
 * written in the text are always recognised, as in Hugging Face's default. */
int zr_tokenizer_encode(const zr_tokenizer *tok, const char *text, size_t len,
                        int add_special_tokens, int32_t **ids, int64_t *n);

/* Decodes ids into *out (malloc'd, NUL-terminated, caller frees). Unknown ids are skipped;
 * skip_special_tokens drops added tokens marked special. Invalid UTF-8 produced by byte tokens
 * becomes U+FFFD, as in Hugging Face. */
int zr_tokenizer_decode(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                        int skip_special_tokens, char **out);
/* Same, also giving the length in bytes: the text holds a 0 byte when an id stands for one. */
int zr_tokenizer_decode_len(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                            int skip_special_tokens, char **out, int64_t *len);

/* Replaces the tokenizer.json's normalizers and pre-tokenizers by one Metaspace pre-tokenizer ("▁",
 * no split, prepend_scheme ZR_PREPEND_ALWAYS / FIRST / NEVER): the pipeline transformers 5 builds for
 * its SentencePiece-BPE classes (LlamaTokenizer: "first", or "always" with legacy = true), whose ids
 * differ from the file's Prepend normalizer after special tokens and before a leading space; and
 * its decoder ("▁" -> " ", ByteFallback, Fuse, one leading space stripped unless NEVER). */
enum { ZR_PREPEND_ALWAYS, ZR_PREPEND_FIRST, ZR_PREPEND_NEVER };
int zr_tokenizer_use_metaspace(zr_tokenizer *tok, int prepend_scheme);

/* Sets the ByteLevel pre-tokenizers' add_prefix_space (a space before text that starts without one): what
 * transformers 5's GPT2Tokenizer builds from tokenizer_config.json's add_prefix_space (false when absent). */
void zr_tokenizer_set_add_prefix_space(zr_tokenizer *tok, int on);

/* Replaces parts of the pipeline by those of json[0..len), an object with any of tokenizer.json's
 * "normalizer", "pre_tokenizer" and "decoder" (null: none; an absent key keeps the tokenizer's part):
 * the pipeline transformers 5 builds for a class (Qwen2Tokenizer: NFC, its Split regex, ByteLevel).
 * A part that does not load leaves the tokenizer unchanged. */
int zr_tokenizer_set_pipeline(zr_tokenizer *tok, const char *json, size_t len);

/* 1 + the largest id of the model vocabulary and the added tokens (the embedding rows needed). */
int64_t zr_tokenizer_vocab_size(const zr_tokenizer *tok);
/* -1 when absent. Added tokens are looked up first, as in Hugging Face. */
int32_t zr_tokenizer_token_to_id(const zr_tokenizer *tok, const char *token);
/* The token's string (NUL-terminated; *len gets its bytes when len is non-NULL), or NULL. */
const char *zr_tokenizer_id_to_token(const zr_tokenizer *tok, int32_t id, int64_t *len);
/* -1 when not known. */
int32_t zr_tokenizer_bos_id(const zr_tokenizer *tok);
int32_t zr_tokenizer_eos_id(const zr_tokenizer *tok);
int32_t zr_tokenizer_pad_id(const zr_tokenizer *tok);
/* Cuts ids[0..*n), an encoding's ids, to max_length as the `tokenizers` library truncates: the text's
 * ids, keeping the special tokens the post-processor put around them (add_special_tokens: as encoded),
 * from the end or, with tokenizer_config.json's truncation_side "left" (else tokenizer.json's truncation
 * direction "Left"), the start. An error when
 * max_length cannot hold the special tokens. */
int zr_tokenizer_truncate(const zr_tokenizer *tok, int32_t *ids, int64_t *n, int64_t max_length,
                          int add_special_tokens);
/* 1 if id is an added token marked "special". */
int zr_tokenizer_is_special(const zr_tokenizer *tok, int32_t id);

#endif
