// The C++ baseline of scripts/bench_sim.py: best fit over an address-ordered free list with
// std::set (size, address) and std::map (address -> size), the same rules as tracekit's best-fit
// policy on an unbounded heap. Input: n, then kind (int8), size (int64), mate (int64) per event.
// Output: CPU seconds of the replay loop, peak live bytes, peak extent, OOM count.
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>
int main(int argc, char** argv) {
  FILE* f = std::fopen(argv[1], "rb");
  int64_t n;
  if (std::fread(&n, 8, 1, f) != 1) return 2;
  std::vector<int8_t> kind(n);
  std::vector<int64_t> size(n), mate(n);
  if (std::fread(kind.data(), 1, n, f) != (size_t)n) return 2;
  if (std::fread(size.data(), 8, n, f) != (size_t)n) return 2;
  if (std::fread(mate.data(), 8, n, f) != (size_t)n) return 2;
  std::fclose(f);
  const int64_t cap = int64_t(1) << 60;
  std::clock_t t0 = std::clock();
  std::set<std::pair<int64_t, int64_t>> by_size;  // (size, addr)
  std::map<int64_t, int64_t> by_addr;             // addr -> size
  std::vector<int64_t> at(n, -1), len(n, 0);
  by_size.insert({cap, 0});
  by_addr[0] = cap;
  int64_t live = 0, peak_live = 0, peak_ext = 0, ooms = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (kind[i] == 0) {
      int64_t r = ((size[i] + 511) >> 9) << 9;
      if (r < 512) r = 512;
      auto it = by_size.lower_bound({r, 0});
      if (it == by_size.end()) { ++ooms; break; }
      int64_t s = it->first, a = it->second;
      by_size.erase(it);
      by_addr.erase(a);
      if (s > r) { by_size.insert({s - r, a + r}); by_addr[a + r] = s - r; }
      at[i] = a; len[i] = r; live += r;
      if (live > peak_live) peak_live = live;
      if (a + r > peak_ext) peak_ext = a + r;
    } else if (kind[i] == 1) {
      int64_t m = mate[i];
      if (m < 0 || at[m] < 0) continue;
      int64_t a = at[m], s = len[m];
      live -= s;
      auto nx = by_addr.find(a + s);
      if (nx != by_addr.end()) { by_size.erase({nx->second, nx->first}); s += nx->second; by_addr.erase(nx); }
      auto pv = by_addr.lower_bound(a);
      if (pv != by_addr.begin()) {
        --pv;
        if (pv->first + pv->second == a) {
          by_size.erase({pv->second, pv->first}); a = pv->first; s += pv->second; by_addr.erase(pv);
        }
      }
      by_size.insert({s, a}); by_addr[a] = s;
    }
  }
  double sec = double(std::clock() - t0) / CLOCKS_PER_SEC;
  std::printf("%.6f %lld %lld %lld\n", sec, (long long)peak_live, (long long)peak_ext, (long long)ooms);
  return 0;
}
