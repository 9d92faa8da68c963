/* Stand-in for the QAIRT SDK's lib/x86_64-linux-clang/libQnnHtp.so (tests only).
 *
 * A thin QNN backend that forwards everything to the onnxruntime-qnn wheel's real libQnnHtp.so
 * (path in QNN_STANDIN_REAL_BACKEND) and names the graph it creates QNN_STANDIN_GRAPH_NAME.
 * The stand-in qnn-context-binary-generator compiles through onnxruntime, which would otherwise
 * name the graph after its own partition; the real generator names it as the model library
 * (i.e. the converter) does, and that name is what htp_config.json must match.
 *
 * Layout from the public QnnInterface.h: QnnInterface_t = { uint32 backendId; const char*
 * providerName; Qnn_ApiVersion_t apiVersion (6 x uint32); QNN_INTERFACE_VER_TYPE functions },
 * where graphCreate is function #15 (after propertyHasCapability, 8 backend and 6 context ones).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef uint64_t qnn_error_t;
typedef struct {
  uint32_t backend_id;
  const char* provider_name;
  uint32_t api_version[6];
  void* functions[16];
} qnn_interface_t;
typedef qnn_error_t (*get_providers_fn)(const qnn_interface_t***, uint32_t*);
typedef qnn_error_t (*graph_create_fn)(void*, const char*, const void**, void**);

enum { GRAPH_CREATE = 15 };
static graph_create_fn real_graph_create;

static qnn_error_t renamed_graph_create(void* context, const char* name, const void** config, void** graph) {
  const char* wanted = getenv("QNN_STANDIN_GRAPH_NAME");
  return real_graph_create(context, (wanted && *wanted) ? wanted : name, config, graph);
}

qnn_error_t QnnInterface_getProviders(const qnn_interface_t*** providers, uint32_t* count) {
  const char* real = getenv("QNN_STANDIN_REAL_BACKEND");
  void* handle = real ? dlopen(real, RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!handle) {
    fprintf(stderr, "stand-in libQnnHtp.so: cannot load the real HTP backend (%s)\n", real ? dlerror() : "unset");
    return 1;
  }
  get_providers_fn get = (get_providers_fn)dlsym(handle, "QnnInterface_getProviders");
  qnn_error_t err = get ? get(providers, count) : 1;
  if (err) return err;
  long page = sysconf(_SC_PAGESIZE);
  for (uint32_t i = 0; i < *count; i++) {
    qnn_interface_t* iface = (qnn_interface_t*)(*providers)[i];
    if (iface->functions[GRAPH_CREATE] == (void*)renamed_graph_create) continue;
    uintptr_t slot = (uintptr_t)&iface->functions[GRAPH_CREATE];
    uintptr_t start = slot & ~(uintptr_t)(page - 1);
    size_t length = (size_t)(slot + sizeof(void*) - start);
    if (mprotect((void*)start, length, PROT_READ | PROT_WRITE) != 0) return 1;
    real_graph_create = (graph_create_fn)iface->functions[GRAPH_CREATE];
    iface->functions[GRAPH_CREATE] = (void*)renamed_graph_create;
  }
  return 0;
}
