# Stages vs model size: the largest GPT that trained on K stages of the same memory,
# without and with re-materialization, for a deeper and a wider family; dashed, K times
# the one-stage maximum (what "K devices hold K times the model" promises). Call with
#   gnuplot -e "data='model_size.dat'; out='model_size.png'; title_text='...'" model_size.gp
# model_size.dat: family K recompute params ratio_to_k_times_1 measured_peak_over_predicted
# (pipetrain-bench model-size, PIPETRAIN_BENCH_DATA_OUT); rows in K order per series.
if (!exists("title_text")) title_text = "Stages vs model size"
set terminal pngcairo size 1100,450 font "DejaVu Sans,10"
set output out
set termoption noenhanced
set multiplot layout 1,2 title title_text
set logscale xy 2
set xrange [0.8:10]
set xtics (1, 2, 4, 8)
set format y "%.0f"
set xlabel "stages K"
set ylabel "parameters (millions)"
set grid lc rgb "#eeeeee"
set key top left box opaque
modes = "never always"
colours = "#4C72B0 #C44E52"
do for [fam in "depth width"] {
  set title (fam eq "depth" ? "deeper: d_model 128, more blocks" : "wider: 8 blocks, larger d_model")
  plot for [i = 1:2] data using (strcol(1) eq fam && strcol(3) eq word(modes, i) ? $2 : 1/0):($4 / 1e6) \
         with linespoints pt 7 lw 2 lc rgb word(colours, i) \
         title sprintf("recompute %s", word(modes, i)), \
       for [i = 1:2] data using (strcol(1) eq fam && strcol(3) eq word(modes, i) ? $2 : 1/0):($4 / $5 / 1e6) \
         with lines dt 2 lc rgb word(colours, i) title sprintf("K x the K = 1 maximum (%s)", word(modes, i))
}
unset multiplot
