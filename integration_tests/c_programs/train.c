/* A plain TensorFlow C-API training program, written as any C user would (it knows nothing of
 * Salus): imports a GraphDef, runs its init op, then runs the train op STEPS times and prints
 * the loss of each step. Used by test_c_api_shim.py with and without libsalus_tf.so preloaded.
 *
 *   train GRAPH.pb INIT_OP TRAIN_OP LOSS_TENSOR STEPS [CONFIG.pb]
 *
 * CONFIG.pb: a serialized ConfigProto for TF_SetConfig. With HOLD_SESSION=1 in the environment
 * it prints "holding" after training and keeps the session open until stdin closes (so a test
 * can list the live job). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tensorflow/c/c_api.h>

static void check(TF_Status *status, const char *what) {
    if (TF_GetCode(status) != TF_OK) {
        fprintf(stderr, "error: %s: %s (code %d)\n", what, TF_Message(status), (int)TF_GetCode(status));
        exit(2);
    }
}

static TF_Buffer *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(size > 0 ? size : 1);
    if (size > 0 && fread(data, 1, size, f) != (size_t)size) { perror(path); exit(2); }
    fclose(f);
    TF_Buffer *buf = TF_NewBufferFromString(data, size);
    free(data);
    return buf;
}

static TF_Operation *op(TF_Graph *graph, const char *name) {
    TF_Operation *o = TF_GraphOperationByName(graph, name);
    if (!o) { fprintf(stderr, "error: no operation %s in the graph\n", name); exit(2); }
    return o;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s GRAPH.pb INIT_OP TRAIN_OP LOSS_TENSOR STEPS [CONFIG.pb]\n", argv[0]);
        return 64;
    }
    int steps = atoi(argv[5]);
    const char *config_path = argc > 6 ? argv[6] : "-";
    const char *hold_env = getenv("HOLD_SESSION");
    int hold = hold_env && strcmp(hold_env, "1") == 0;

    TF_Status *status = TF_NewStatus();
    TF_Graph *graph = TF_NewGraph();
    TF_Buffer *graph_def = read_file(argv[1]);
    TF_ImportGraphDefOptions *import_opts = TF_NewImportGraphDefOptions();
    TF_GraphImportGraphDef(graph, graph_def, import_opts, status);
    check(status, "importing the GraphDef");
    TF_DeleteImportGraphDefOptions(import_opts);
    TF_DeleteBuffer(graph_def);

    TF_SessionOptions *opts = TF_NewSessionOptions();
    if (strcmp(config_path, "-") != 0) {
        TF_Buffer *config = read_file(config_path);
        TF_SetConfig(opts, config->data, config->length, status);
        check(status, "setting the session config");
        TF_DeleteBuffer(config);
    }
    TF_Session *session = TF_NewSession(graph, opts, status);
    check(status, "creating the session");
    TF_DeleteSessionOptions(opts);

    const TF_Operation *init = op(graph, argv[2]);
    TF_SessionRun(session, NULL, NULL, NULL, 0, NULL, NULL, 0, &init, 1, NULL, status);
    check(status, "running the init op");

    char loss_name[256];
    snprintf(loss_name, sizeof loss_name, "%s", argv[4]);
    char *colon = strchr(loss_name, ':');
    int loss_index = colon ? atoi(colon + 1) : 0;
    if (colon) *colon = '\0';
    TF_Output loss = {op(graph, loss_name), loss_index};
    const TF_Operation *train = op(graph, argv[3]);
    for (int step = 0; step < steps; step++) {
        TF_Tensor *value = NULL;
        TF_SessionRun(session, NULL, NULL, NULL, 0, &loss, &value, 1, &train, 1, NULL, status);
        check(status, "running a training step");
        /* %a prints the exact float: equal output means bit-identical losses. */
        printf("step %d loss %a %.6g\n", step, (double)*(float *)TF_TensorData(value),
               (double)*(float *)TF_TensorData(value));
        TF_DeleteTensor(value);
    }
    if (hold) {
        printf("holding\n");
        fflush(stdout);
        while (getchar() != EOF) {}
    }
    TF_CloseSession(session, status);
    check(status, "closing the session");
    TF_DeleteSession(session, status);
    TF_DeleteGraph(graph);
    TF_DeleteStatus(status);
    return 0;
}
