/* Serves a SavedModel with TensorFlow's C API, as any C user would: loads it with
 * TF_LoadSessionFromSavedModel, feeds one row of floats and prints the output row.
 *
 *   serve EXPORT_DIR TAG INPUT_TENSOR OUTPUT_TENSOR X1 [X2 ...]
 *
 * The input is a float32 tensor of shape [1, N]; the output must be float32. With HOLD_SESSION=1
 * in the environment it prints "holding" and keeps the session open until stdin closes.
 * With SAVE_PREFIX, SAVER_FILENAME_TENSOR and SAVER_SAVE_TENSOR (the MetaGraphDef's saver_def) it
 * then saves the model's variables to SAVE_PREFIX and prints "saved". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tensorflow/c/c_api.h>
#include <tensorflow/c/tf_tstring.h>

static void check(TF_Status *status, const char *what) {
    if (TF_GetCode(status) != TF_OK) {
        fprintf(stderr, "error: %s: %s (code %d)\n", what, TF_Message(status), (int)TF_GetCode(status));
        exit(2);
    }
}

static TF_Output output_named(TF_Graph *graph, const char *tensor) {
    char name[512];
    snprintf(name, sizeof name, "%s", tensor);
    char *colon = strchr(name, ':');
    int index = colon ? atoi(colon + 1) : 0;
    if (colon) *colon = '\0';
    TF_Operation *o = TF_GraphOperationByName(graph, name);
    if (!o) { fprintf(stderr, "error: no operation %s in the graph\n", name); exit(2); }
    TF_Output out = {o, index};
    return out;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s EXPORT_DIR TAG INPUT_TENSOR OUTPUT_TENSOR X1 [X2 ...]\n", argv[0]);
        return 64;
    }
    int n = argc - 5;
    TF_Status *status = TF_NewStatus();
    TF_Graph *graph = TF_NewGraph();
    TF_SessionOptions *opts = TF_NewSessionOptions();
    TF_Buffer *meta_graph = TF_NewBuffer();
    const char *tags[] = {argv[2]};
    TF_Session *session = TF_LoadSessionFromSavedModel(opts, NULL, argv[1], tags, 1, graph, meta_graph, status);
    check(status, "loading the SavedModel");
    if (meta_graph->length == 0) { fprintf(stderr, "error: empty MetaGraphDef\n"); return 2; }
    TF_DeleteBuffer(meta_graph);
    TF_DeleteSessionOptions(opts);

    int64_t dims[2] = {1, n};
    TF_Tensor *input = TF_AllocateTensor(TF_FLOAT, dims, 2, sizeof(float) * n);
    float *x = TF_TensorData(input);
    for (int i = 0; i < n; i++) x[i] = strtof(argv[5 + i], NULL);
    TF_Output in = output_named(graph, argv[3]);
    TF_Output out = output_named(graph, argv[4]);
    TF_Tensor *result = NULL;
    TF_SessionRun(session, NULL, &in, &input, 1, &out, &result, 1, NULL, 0, NULL, status);
    check(status, "running the model");
    size_t count = TF_TensorByteSize(result) / sizeof(float);
    const float *y = TF_TensorData(result);
    printf("output");
    for (size_t i = 0; i < count; i++) printf(" %a", (double)y[i]);
    printf("\n");
    const char *hold = getenv("HOLD_SESSION");
    if (hold && strcmp(hold, "1") == 0) {
        printf("holding\n");
        fflush(stdout);
        while (getchar() != EOF) {}
    }
    const char *save_prefix = getenv("SAVE_PREFIX");
    if (save_prefix) {
        TF_Output filename = output_named(graph, getenv("SAVER_FILENAME_TENSOR"));
        TF_Output save = output_named(graph, getenv("SAVER_SAVE_TENSOR"));
        TF_Tensor *prefix = TF_AllocateTensor(TF_STRING, NULL, 0, sizeof(TF_TString));
        TF_TString *text = TF_TensorData(prefix);
        TF_StringInit(text);
        TF_StringCopy(text, save_prefix, strlen(save_prefix));
        TF_Tensor *saved = NULL;
        TF_SessionRun(session, NULL, &filename, &prefix, 1, &save, &saved, 1, NULL, 0, NULL, status);
        if (TF_GetCode(status) != TF_OK) {
            fprintf(stderr, "error: saving the model: %s (code %d)\n", TF_Message(status), (int)TF_GetCode(status));
            return 3;
        }
        printf("saved\n");
        TF_DeleteTensor(saved);
        TF_StringDealloc(text);
        TF_DeleteTensor(prefix);
    }
    TF_DeleteTensor(result);
    TF_DeleteTensor(input);
    TF_CloseSession(session, status);
    check(status, "closing the session");
    TF_DeleteSession(session, status);
    TF_DeleteGraph(graph);
    TF_DeleteStatus(status);
    return 0;
}
