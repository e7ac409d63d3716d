/*
fuzz_corpus.h: the seed files of the fuzzer (tests/fuzz.c), written by
`test_gpt --write-fixtures DIR` beside the end-to-end suites' fixtures: a model small enough
that every mutation matters (a few KB), a token shard, a training state of that model that
resumes cleanly on that shard (and its manifest), a tokenizer, a small BPE (encoder.json and
vocab.bpe), and a JSON Lines and a text file that prepare_tokens reads. The fuzzer reads the
shapes from here.
*/
#ifndef TESTS_FUZZ_CORPUS_H
#define TESTS_FUZZ_CORPUS_H

#define FUZZ_MODEL_FILE "fuzz_model.bin"
#define FUZZ_SHARD_FILE "fuzz_shard.bin"
#define FUZZ_STATE_FILE "fuzz_state.bin"
#define FUZZ_TOKENIZER_FILE "fuzz_tokenizer.bin"
#define FUZZ_BPE_ENCODER_FILE "fuzz_encoder.json"  // a small BPE (llmc/bpe.h): the 256 bytes, a few merges
#define FUZZ_BPE_VOCAB_FILE "fuzz_vocab.bpe"
#define FUZZ_BPE_TEXT " the hello\n\n  'll 42 \xc3\xa9"  // what the fuzzer encodes with a BPE it loaded
#define FUZZ_MANIFEST_FILE "fuzz_shard_manifest.txt"  // the shard's manifest (llmc/manifest.h), beside it
#define FUZZ_JSONL_FILE "fuzz_text.jsonl"  // prepare_tokens' JSON Lines (dev/data/text_input.h), field "text"
#define FUZZ_JSONL_TEXT \
    "{\"text\": \"Hello, world! caf\\u00e9 \\ud83d\\ude00\", \"id\": 1, \"meta\": {\"a\": [1, -2.5e3, null, true, false]}}\n" \
    "{\"id\": 2, \"text\": \"two\\nlines \\\"quoted\\\" \\\\ \\/ \\t raw \xc3\xa9 \xe4\xb8\xad\", \"text2\": \"x\"}\n" \
    "\n" \
    "  {\"text\": \"\"}  \r\n"
#define FUZZ_TEXT_FILE "fuzz_text.txt"     // prepare_tokens' text, blank-line documents
#define FUZZ_TEXT_TEXT "First 'll para.\n\nSecond  para 42\n\n\n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xe3\x80\x80tail\n"
#define FUZZ_CONFIG {8, 16, 16, 1, 2, 8, 1, 1, 0, 0}  // maxT, V, Vp, L, NH, C, tp, pp, stage, first layer: 1080 parameters
#define FUZZ_SHARD_TOKENS 200             // ids < V
#define FUZZ_B 1                          // the state's run: micro-batches of (1, 4), one rank, AdamW
#define FUZZ_T 4
#define FUZZ_STEP 3                       // the state is of step 3: data position 3 * B * T
#define FUZZ_RUN_ID 0x5eed5eed5eed5eedULL

// the rendezvous's messages (llmc/rendezvous_proto.h): rank 1's HELLO of a world of 2, and rank 0's
// ANSWER to it, each read by the other side's parser; the exchange is made from fixed nonces, so the
// writer (test_gpt) and the readers (the fuzzer) make the same one
#include "../llmc/rendezvous_proto.h"
#define FUZZ_RDV_HELLO_FILE "fuzz_rdv_hello.bin"
#define FUZZ_RDV_ANSWER_FILE "fuzz_rdv_answer.bin"
#define FUZZ_RDV_SECRET "fuzz-rendezvous-secret"
#define FUZZ_RDV_SETTINGS 0x5e7715a5e7715aULL
#define FUZZ_RDV_ID_BYTES 128      // NCCL's id
#define FUZZ_RDV_NONCE_BYTE 0x42   // every byte of both nonces

// k, and x holding the HELLO (hello: its bytes) and, with answer != NULL, rank 0's ANSWER (its bytes)
static void fuzz_rdv_exchange(RendezvousKeys* k, RendezvousExchange* x, uint8_t* hello, uint8_t* answer) {
    RendezvousParty peer = {1, 2, FUZZ_RDV_SETTINGS, 0}, rank0 = {0, 2, FUZZ_RDV_SETTINGS, 0};
    uint8_t nonce[RENDEZVOUS_NONCE_BYTES], id[FUZZ_RDV_ID_BYTES];
    memset(nonce, FUZZ_RDV_NONCE_BYTE, sizeof(nonce));
    for (int i = 0; i < FUZZ_RDV_ID_BYTES; i++) { id[i] = (uint8_t)i; }
    rendezvous_keys(k, FUZZ_RDV_SECRET, strlen(FUZZ_RDV_SECRET));
    rendezvous_hello(k, x, &peer, nonce, hello);
    if (answer != NULL) {
        static RendezvousExchange server;
        char why[RENDEZVOUS_WHY_LEN];
        rendezvous_read_hello(k, &server, hello, RENDEZVOUS_HELLO_BYTES, why, sizeof(why));
        rendezvous_answer(k, &server, &rank0, RDV_OK, nonce, id, sizeof(id), answer);
    }
}

#endif // TESTS_FUZZ_CORPUS_H
