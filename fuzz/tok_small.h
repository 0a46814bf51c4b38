/* fuzz/tok_small.h — a small byte-level tokenizer.json for the tokenizer harnesses: GPT-4o's
 * split regex, NFC, the 256 byte tokens plus a few merges, special and plain added tokens, a
 * bos post-processor. */
#ifndef BATON_FUZZ_TOK_SMALL_H
#define BATON_FUZZ_TOK_SMALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

/* The byte-level alphabet's character for byte b, as UTF-8 (NUL-terminated). */
static inline void tok_small_byte_char(int b, char out[4])
{
    int n = 0, cp = 0;
    for (int x = 0; x <= b; x++) {
        bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        cp = printable ? x : 256 + n++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* The document as a JSON string (free() it); nfc adds the NFC normalizer. */
static inline char *tok_small_json(bool nfc)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[4];
        tok_small_byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    const char *extra[] = {"he", "ll", "hell", "hello", "wo", "wor", "world", "12", "123"};
    const char *merges[] = {"h e",  "l l",    "he ll", "hell o", "w o",
                            "wo r", "wor ld", "1 2",   "12 3"};
    json_t *m = json_array();
    for (int i = 0; i < 9; i++) {
        json_object_set_new(vocab, extra[i], json_integer(256 + i));
        json_array_append_new(m, json_string(merges[i]));
    }
    json_object_set_new(vocab, "ld", json_integer(265)); /* "wor ld" needs "ld" as a token */
    json_t *doc = json_pack(
        "{s:o, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s, s:o, s:o},"
        " s:[{s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}],"
        " s:{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}}}, s:{s:s}}",
        "normalizer", nfc ? json_pack("{s:s}", "type", "NFC") : json_null(), "pre_tokenizer",
        "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
        "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}"
        "\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "use_regex", 0, "model", "type", "BPE", "vocab", vocab, "merges", m, "added_tokens", "id",
        300, "content", "<|s|>", "special", 1, "normalized", 0, "id", 301, "content", "<think>",
        "special", 0, "normalized", 1, "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<|s|>", "Sequence", "id", "A", "special_tokens", "<|s|>", "ids", 300,
        "decoder", "type", "ByteLevel");
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return s;
}

#endif
