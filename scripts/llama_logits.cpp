// llama.cpp's logits of a quantized model run on its own dequantization of it, with no activation
// rounding (scripts/record_golden_dequant.py writes the golden from what this prints).
//
// 1. llama_model_quantize(QUANT, F32, ftype ALL_F32, allow_requantize): llama.cpp dequantizes
//    every tensor with its own to_float into an F32 model.
// 2. That F32 model on the CPU (n_ctx 256, F32 KV cache, flash attention off, 2 threads): the
//    prompt in one batch (every row's logits), then N greedy steps one token per decode (argmax,
//    ties to the lowest id), each step's logits.
// The script then reads F32_OUT itself (the tensors llama.cpp dequantized, hashed into the golden).
// Input PROMPT: one line of prompt ids then one line with N. Output OUT: one line of logits per
// prompt row, then per step "<token> <logits...>".
// Usage: llama_logits QUANT.gguf F32_OUT.gguf PROMPT.txt OUT.txt
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void write_row(FILE * out, const float * row, int n) {
    for (int i = 0; i < n; i++) fprintf(out, i ? " %.9g" : "%.9g", row[i]);
    fprintf(out, "\n");
}

int main(int argc, char ** argv) {
    if (argc != 5) { fprintf(stderr, "usage: llama_logits QUANT.gguf F32_OUT.gguf PROMPT.txt OUT.txt\n"); return 2; }
    llama_backend_init();
    auto qp = llama_model_quantize_default_params();
    qp.ftype = LLAMA_FTYPE_ALL_F32;
    qp.allow_requantize = true;
    qp.nthread = 2;
    if (llama_model_quantize(argv[1], argv[2], &qp) != 0) { fprintf(stderr, "dequantize failed\n"); return 1; }

    std::ifstream in(argv[3]);
    std::string line;
    std::getline(in, line);
    std::istringstream ids(line);
    std::vector<llama_token> prompt;
    for (int t; ids >> t;) prompt.push_back(t);
    int steps = 0;
    in >> steps;

    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[2], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(argv[4], "w");

    llama_batch batch = llama_batch_init(512, 0, 1);
    auto feed = [&](const std::vector<llama_token> & toks, int pos) {
        batch.n_tokens = (int) toks.size();
        for (int i = 0; i < batch.n_tokens; i++) {
            batch.token[i] = toks[i];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = true;
        }
        return llama_decode(ctx, batch) == 0;
    };
    if (!feed(prompt, 0)) { fprintf(stderr, "decode failed\n"); return 1; }
    for (int i = 0; i < (int) prompt.size(); i++) write_row(out, llama_get_logits_ith(ctx, i), n_vocab);
    const float * row = llama_get_logits_ith(ctx, (int) prompt.size() - 1);
    int pos = (int) prompt.size();
    for (int s = 0; s < steps; s++) {
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (row[i] > row[best]) best = i;   // ties: lowest id
        fprintf(out, "%d ", best);
        if (!feed({best}, pos++)) { fprintf(stderr, "decode failed\n"); return 1; }
        row = llama_get_logits_ith(ctx, 0);
        write_row(out, row, n_vocab);
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
