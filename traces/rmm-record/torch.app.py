
import json, sys
import rmm, rmm.mr
import torch, torchvision
from rmm.allocators.torch import rmm_torch_allocator
rmm.reinitialize(pool_allocator=True, initial_pool_size=0)
stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.get_current_device_resource())
rmm.mr.set_current_device_resource(stats)
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
model = torchvision.models.resnet18().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    x = torch.randn(16, 3, 224, 224, device="cuda")
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
s = stats.allocation_counts
json.dump({"total_count": s.total_count, "total_bytes": s.total_bytes}, open(sys.argv[1], "w"))
