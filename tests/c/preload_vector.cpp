// A C++ program no part of ckalloc knows of: grows a std::vector to 1 GiB
// through operator new (libstdc++'s, which calls malloc), then prints a
// checksum of its bytes and whether its buffer is a ckalloc block (2 MiB
// aligned, usable size a multiple of 2 MiB), so a run under
// libckalloc_preload.so can be compared with a run without it.
#include <malloc.h>
#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
    const std::size_t target = std::size_t(1) << 30;
    std::vector<unsigned char> v;
    std::vector<unsigned char> chunk(1 << 20);
    std::uint32_t x = 12345;
    while (v.size() < target) {
        for (auto &b : chunk) {
            x = x * 1664525u + 1013904223u;
            b = static_cast<unsigned char>(x >> 24);
        }
        v.insert(v.end(), chunk.begin(), chunk.end());
    }
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < v.size(); i += 4093) h = (h ^ v[i]) * 1099511628211ull;
    const auto p = reinterpret_cast<std::uintptr_t>(v.data());
    const std::size_t usable = malloc_usable_size(v.data());
    const bool ck = p % (2u << 20) == 0 && usable % (2u << 20) == 0;
    std::printf("bytes %zu checksum %016llx\n", v.size(), static_cast<unsigned long long>(h));
    std::fprintf(stderr, "ckalloc block: %s\n", ck ? "yes" : "no");
    return 0;
}
