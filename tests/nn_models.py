"""The two small models behind tests/fixtures/nn/, written once against an ``nn`` namespace:
tests/fixtures/make_fixtures.py builds them with ``torch.nn`` (and saves PyTorch's weights and
outputs), tests/test_nn.py with ``ember.nn`` (and loads those weights by the same keys). The same
source on both sides is the point: ember.nn takes PyTorch model code as it is."""


def define(nn):
    """``(Net, Layers)``, built from ``nn`` (``torch.nn`` or ``ember.nn``)."""

    class Net(nn.Module):
        """Every ember.nn layer kind once."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),                                # (B,8,8,8)
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.MaxPool2d(2),                                              # (B,8,4,4)
                nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False),
                nn.SiLU(),
                nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),  # (B,4,8,8)
                nn.AvgPool2d(2),                                              # (B,4,4,4)
                nn.Sigmoid(),
                nn.AdaptiveAvgPool2d((2, 2)),                                 # (B,4,2,2)
                nn.Flatten(),                                                 # (B,16)
            )
            self.emb = nn.Embedding(10, 16)
            self.norm = nn.LayerNorm(16)
            self.head = nn.ModuleList([nn.Linear(16, 12), nn.GELU(approximate="tanh"), nn.Dropout(0.1),
                                       nn.Linear(12, 12), nn.GELU(), nn.Tanh(), nn.Linear(12, 5)])
            self.softmax = nn.Softmax(dim=-1)

        def forward(self, x, ids):
            h = self.norm(self.features(x) + self.emb(ids).mean(1))
            for m in self.head:
                h = m(h)
            return h, self.softmax(h)


    class Layers(nn.Module):
        """Constructor options one by one (padding modes, dilation, groups, no bias, ceil_mode...);
        forward returns each layer's output on the same input."""

        def __init__(self):
            super().__init__()
            self.reflect = nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
            self.replicate = nn.Conv2d(2, 3, (3, 2), padding=(1, 2), padding_mode="replicate", bias=False)
            self.circular = nn.Conv2d(2, 4, 3, padding=2, dilation=2, padding_mode="circular", groups=2)
            self.same = nn.Conv2d(2, 3, (4, 3), padding="same")
            self.strided = nn.Conv2d(2, 3, 3, stride=2, padding=1)
            self.tconv = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
            self.tconv_dil = nn.ConvTranspose2d(2, 3, (2, 3), stride=(1, 2), dilation=2, bias=False)
            self.bn_noaffine = nn.BatchNorm2d(2, affine=False)
            self.bn_batch = nn.BatchNorm2d(2, track_running_stats=False)
            self.ln2d = nn.LayerNorm((5, 6), bias=False)
            self.ln_plain = nn.LayerNorm(6, elementwise_affine=False, eps=1e-3)
            self.fc_nobias = nn.Linear(6, 4, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
            self.avgpool = nn.AvgPool2d((2, 3), stride=1, padding=1, count_include_pad=False)
            self.adaptive = nn.AdaptiveAvgPool2d((None, 4))
            self.softmax_legacy = nn.Softmax()
            self.flatten = nn.Flatten(0, 1)
            self.gelu = nn.GELU()
            self.emb = nn.Embedding(7, 3, padding_idx=2)

        def forward(self, x, ids):
            return {name: (m(ids) if name == "emb" else m(x)) for name, m in self.named_children()}

    return Net, Layers
