// Tokenize records with llama.cpp (llama_tokenize as llama-cpp-python's Llama.tokenize calls it).
// Input records: "<special> <nbytes>\n<bytes>\n"; output: one line of ids per record.
// With a fourth argument, also the token attributes as llama.cpp set them at load: one line per id,
// "<llama_token_attr bits> <1 if llama_vocab_is_eog>" (scripts/record_golden_token_types.py).
// Usage: llama_tokenize VOCAB.gguf TEXTS.rec OUT.ids [OUT.attrs]
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char ** argv) {
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2], std::ios::binary);
    FILE * out = fopen(argv[3], "w");
    int special; size_t n;
    while (in >> special >> n) {
        in.get();
        std::string text(n, '\0');
        in.read(&text[0], n);
        in.get();
        std::vector<llama_token> toks(n * 2 + 16);
        int k = llama_tokenize(vocab, text.data(), text.size(), toks.data(), toks.size(), false, special != 0);
        if (k < 0) { toks.resize(-k); k = llama_tokenize(vocab, text.data(), text.size(), toks.data(), toks.size(), false, special != 0); }
        for (int i = 0; i < k; i++) fprintf(out, i ? " %d" : "%d", toks[i]);
        fprintf(out, "\n");
    }
    fclose(out);
    if (argc > 4) {
        FILE * attrs = fopen(argv[4], "w");
        for (llama_token id = 0; id < llama_vocab_n_tokens(vocab); id++) {
            fprintf(attrs, "%d %d\n", (int) llama_vocab_get_attr(vocab, id), llama_vocab_is_eog(vocab, id) ? 1 : 0);
        }
        fclose(attrs);
    }
    llama_model_free(model);
    return 0;
}
